"""``python -m lightning_gaudi PROGRAM [ARGS...]`` (``lightning_gaudi/__main__.py``): a program that never imports
``lightning_gaudi`` trains on the (emulated) HPU, on several devices too, with its own arguments, exit code and
signal handling."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_gaudi import hpu
from lightning_gaudi.__main__ import ProgramError, parse

PROGRAMS = Path(__file__).parent / "programs"


def test_parse_tells_console_scripts_files_and_modules_apart(tmp_path: Path) -> None:
    assert parse(["lightning-gaudi", "fit", "--x"]) == (("entry_point", "lightning-gaudi"), ["fit", "--x"])
    script = PROGRAMS / "gpu_script.py"
    assert parse([str(script), "2"]) == (("script", str(script.resolve())), ["2"])
    assert parse(["-m", "my.module", "--lr", "1"]) == (("module", "my.module"), ["--lr", "1"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "usage: python -m lightning_gaudi PROGRAM"),
        (["-m"], "needs a module to run"),
        (["--devices", "2"], "Unknown option '--devices'"),
        (["no-such-tool-here"], "'no-such-tool-here' is neither a console script.*nor a program on PATH"),
    ],
)
def test_parse_refuses_what_it_cannot_run(argv: list[str], message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        parse(argv)


def test_parse_refuses_a_program_that_is_not_python(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ProgramError, match="is not a Python program"):
        parse([str(binary)])


def _env() -> dict[str, str]:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    env[hpu.DEVICES_ENV] = "2"
    return env


@pytest.mark.subprocess
@pytest.mark.parametrize(("how", "devices"), [("script", 2), ("module", 1)])
def test_a_gpu_script_trains_on_the_emulated_hpus_with_its_exit_code(tmp_path: Path, how: str, devices: int) -> None:
    program = [str(PROGRAMS / "gpu_script.py")] if how == "script" else ["-m", "programs.gpu_script"]
    command = [sys.executable, "-m", "lightning_gaudi", *program, str(devices), "3", str(tmp_path)]
    proc = subprocess.run(
        command, cwd=PROGRAMS.parent, env=_env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    strategy = "HPUParallelStrategy" if devices > 1 else "SingleHPUStrategy"
    for rank in range(devices):  # rank 1 was started again by Lightning, through `python -m lightning_gaudi`
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts == {
            "accelerator": "HPUAccelerator",
            "strategy": strategy,
            "argv": [str(devices), "3", str(tmp_path)],
        }


@pytest.mark.subprocess
def test_signals_reach_the_programs_own_handlers() -> None:
    command = [sys.executable, "-m", "lightning_gaudi", str(PROGRAMS / "waits_for_sigterm.py")]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 42
    assert "handled SIGTERM" in out


@pytest.mark.subprocess
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_program_reaches_every_rank_and_sets_the_exit_status(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """The signal goes to the program's process only (``kill PID``): rank 1, which Lightning started, stops too."""
    fit = Path(__file__).parent / "reliability_helpers" / "preempt_fit.py"
    command = [sys.executable, "-m", "lightning_gaudi", str(fit), str(tmp_path), "--devices", "2", "--grace", "20"]
    env = {**_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        # SIGINT as a terminal gives it, even where the suite was started in the background (which ignores SIGINT,
        # and a process that starts with SIGINT ignored never raises KeyboardInterrupt)
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    steps = [tmp_path / f"rank{rank}.step" for rank in range(2)]
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not all(step.is_file() for step in steps) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int((tmp_path / f"rank{rank}.pid").read_text()) for rank in range(2)]
        proc.send_signal(sig)
        proc.wait(timeout=60)
        gone = time.monotonic() + 10
        while _running(pids[1]) and time.monotonic() < gone:
            time.sleep(0.1)
        assert not _running(pids[1]), f"rank 1 still runs after the job ended\n{log.read_text()[-3000:]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == code, log.read_text()[-3000:]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")
