"""A job ends promptly and says the truth (issue 40 item 2): the exit barrier has its own short bound
(``LIGHTNING_GAUDI_EXIT_TIMEOUT``), and a rank that fails or is killed at the end makes the job's exit status
non-zero, named on stderr, under Lightning's launcher (rank 0 is the launching process) and under torchrun, for the
Trainer and Fabric. The jobs run ``tests/reliability_helpers/exit_fit.py`` on 2 emulated cards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_gaudi import hpu
from lightning_gaudi.distributed import shutdown

FIT = Path(__file__).parents[1] / "reliability_helpers" / "exit_fit.py"


def _env(exit_timeout: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "LIGHTNING_GAUDI_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        env.pop(name, None)
    env.update({hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1", "LIGHTNING_GAUDI_EXIT_TIMEOUT": str(exit_timeout)})
    return env


def _job(out: Path, how: str, *flags: str, exit_timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs the job to its launching process's end (a rank it leaves running keeps a pipe open: a file instead)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(FIT), str(out), how, *flags]
    if "--torchrun" in flags:
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--monitor-interval=1"]
    log = out / "job.log"
    try:
        with log.open("wb") as file:
            proc = subprocess.Popen(command, env=_env(exit_timeout), stdout=file, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=240)
        finally:
            proc.kill()
        return subprocess.CompletedProcess(command, proc.wait(), "", log.read_text())
    finally:
        for pid_file in out.glob("rank*.pid"):  # no rank outlives the test
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, timedelta(seconds=20)), ("", timedelta(seconds=20)), ("5.5", timedelta(seconds=5.5)), ("0", timedelta())],
)
def test_the_exit_timeout_is_20s_or_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: timedelta
) -> None:
    if value is None:
        monkeypatch.delenv(shutdown.EXIT_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(shutdown.EXIT_TIMEOUT_ENV, value)
    assert shutdown.exit_timeout(timedelta(minutes=10)) == expected
    if value is None:  # never longer than the collective timeout
        assert shutdown.exit_timeout(timedelta(seconds=4)) == timedelta(seconds=4)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_malformed_exit_timeout_is_refused_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch, eager_hpu: hpu.Backend, value: str
) -> None:
    from lightning.pytorch import Trainer

    monkeypatch.setenv(shutdown.EXIT_TIMEOUT_ENV, value)
    message = f"LIGHTNING_GAUDI_EXIT_TIMEOUT='{value}' must be a number of seconds"
    with pytest.raises(ValueError, match=message):
        shutdown.exit_timeout(timedelta(minutes=10))
    with pytest.raises(ValueError, match=message):  # Lightning sets the ranks while the Trainer is built
        Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, logger=False)


@pytest.mark.subprocess
def test_a_rank_still_working_after_fit_does_not_hold_rank_0(tmp_path: Path) -> None:
    """Rank 0 waited for the collective timeout (60 s here) in its exit barrier."""
    job = _job(tmp_path, "linger", exit_timeout=3)
    ended = time.time()
    assert job.returncode == 0, job.stderr[-3000:]
    fitted = float((tmp_path / "rank0.fitted").read_text())
    assert ended - fitted < 3 + 10, f"rank 0 exited {ended - fitted:.1f}s after fit"  # slack: a loaded machine
    assert "rank 1 (pid" in job.stderr
    assert "still runs 3s after this rank finished" in job.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("how", "flags", "code", "says"),
    [
        ("train_end", (), 1, "rank 1 failed with exit code 1"),
        ("teardown", (), 1, "rank 1 failed with exit code 1"),
        ("exit3", (), 3, "rank 1 failed with exit code 3"),
        ("raise", ("--fabric",), 1, "rank 1 failed with exit code 1"),
        ("sigkill", ("--fabric",), 128 + 9, "rank 1 was killed by SIGKILL"),
    ],
)
def test_a_rank_failing_at_the_end_fails_the_job_under_lightnings_launcher(
    tmp_path: Path, how: str, flags: tuple[str, ...], code: int, says: str
) -> None:
    job = _job(tmp_path, how, *flags)
    assert job.returncode == code, job.stderr[-3000:]
    assert f"lightning_gaudi: {says}; the job ends with exit code {code}" in job.stderr


@pytest.mark.subprocess
def test_a_rank_failing_in_on_train_end_fails_the_job_under_torchrun(tmp_path: Path) -> None:
    job = _job(tmp_path, "train_end", "--torchrun")
    assert job.returncode != 0, job.stderr[-3000:]
    assert "rank 1 failed in on_train_end" in job.stderr


#: The launching rank's part: ``shutdown`` loaded from its file alone (``helpers/shutdown_alone.py``), since importing
#: it through the package imports Lightning first, seconds of CPU this test does not need.
WATCHER = f"""
import subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parents[1] / "helpers")!r})
from shutdown_alone import load
shutdown = load()
staging = Path(sys.argv[1])
ranks = [subprocess.Popen([sys.executable, "-c", code]) for code in sys.argv[2:]]
shutdown.watch_ranks(ranks, first_rank=1)
with shutdown.cleanup_on_abort(lambda: staging.rmdir()):  # a save in progress
    time.sleep(60)
"""


@pytest.mark.subprocess
def test_a_rank_ending_143_ends_the_launching_rank_143_and_its_save_is_cleaned_up(tmp_path: Path) -> None:
    """Lightning's observer SIGKILLed the launching rank (-9), and its staging folder stayed until the next save."""
    staging = tmp_path / ".last.ckpt.tmp"
    staging.mkdir()
    pid_file = tmp_path / "rank2.pid"
    rank1 = "import sys, time; time.sleep(1); sys.exit(143)"  # its grace period ran out
    rank2 = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", WATCHER, str(staging), rank1, rank2], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 143, proc.stderr
    assert time.monotonic() - start < 30
    assert "lightning_gaudi: rank 1 failed with exit code 143; the job ends with exit code 143" in proc.stderr
    assert not staging.exists()
    with pytest.raises(ProcessLookupError):  # the other rank was stopped, and waited for
        os.kill(int(pid_file.read_text()), 0)
