"""MPI: ``mpirun -np 2`` (Open MPI) starts a 2-rank ``hpu_parallel`` job on loopback that Lightning sees through
``MPIEnvironment`` (mpi4py) and that trains exactly as the torchrun launch does; SIGTERM to ``mpirun`` stops every
rank with a checkpoint. ``scripts/install-mpi.sh`` installs Open MPI and mpi4py; without them the tests skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.loopback_nodes import FIT, loopback_env, run_nodes, two_node_job
from helpers.shared_job import run_once

from lightning_gaudi import hpu, resume

PREEMPT_FIT = FIT.parent / "preempt_fit.py"
START_TIMEOUT_S = 120
#: Where scripts/install-mpi.sh puts mpi4py: on the ranks' PYTHONPATH only (see that script).
MPI4PY_DIR = Path(__file__).parents[2] / ".mpi4py"


def _open_mpi() -> str | None:
    """Why the MPI tests cannot run here, or ``None``."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return "Open MPI's mpirun is not installed (scripts/install-mpi.sh installs it)"
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60).stdout
    if "Open MPI" not in version:
        return f"mpirun is not Open MPI's ({version.strip()[:80]!r}): the tests use Open MPI's options"
    if importlib.util.find_spec("mpi4py") is None and not (MPI4PY_DIR / "mpi4py").is_dir():
        return "mpi4py is not installed, so Lightning cannot see an mpirun launch (scripts/install-mpi.sh installs it)"
    return None


_MISSING = _open_mpi()
pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))]


def _mpirun(*args: str, np: int = 2) -> list[str]:
    # --bind-to none: Open MPI pins each rank to one core by default, which the emulator would count as 1 card
    return ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.executable, *args]


def _env(**extra: str) -> dict[str, str]:
    """Loopback environment for mpirun: 2 emulated cards on the node; root may run it (containers, CI)."""
    env = loopback_env(
        **{hpu.DEVICES_ENV: "2", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}, **extra
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(MPI4PY_DIR), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job launched by torchrun (2 nodes x 1 process; shared with test_reliability.py)."""
    return run_once(tmp_path_factory, "two-nodes", two_node_job)


def test_mpirun_two_ranks_train_as_the_torchrun_launch(tmp_path: Path, two_node_run: Path) -> None:
    out = tmp_path / "job"
    command = _mpirun(str(FIT), str(out), "--num-nodes", "1", "--devices", "2", "--max-steps", "10", "--every", "5")
    codes, log = run_nodes(out, [command], [_env()])
    assert codes == [0], log[-6000:]
    environments = [(out / f"environment-rank{rank}.txt").read_text().split() for rank in range(2)]
    assert environments[0][0] == environments[1][0] == "MPIEnvironment"
    assert environments[0][1] == environments[1][1]  # one run id (one run folder for the Hydra app)
    assert environments[0][1].startswith("mpi-")
    for rank in range(2):
        assert (out / f"steps-rank{rank}.txt").read_text().split()[1::2] == [str(step) for step in range(1, 11)]
        final, expected = torch.load(out / f"final-rank{rank}.pt"), torch.load(two_node_run / f"final-rank{rank}.pt")
        assert final.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(final[key], value), f"rank {rank}: {key} differs from the torchrun launch"
    assert resume.is_complete_checkpoint(out / "ckpt" / "last.ckpt")


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def test_sigterm_to_mpirun_saves_a_checkpoint_and_ends_every_rank(tmp_path: Path) -> None:
    """Open MPI 4 passes SIGTERM on to the ranks ``odls_base_sigkill_timeout`` seconds after mpirun got it, and kills
    them as long again later (default 1 s: too short for a checkpoint); with 8 s the ranks' grace period fits."""
    out = tmp_path / "job"
    out.mkdir()
    grace, sigkill_timeout = 5.0, 8
    env = _env(OMPI_MCA_odls_base_sigkill_timeout=str(sigkill_timeout))
    log = out / "mpirun.log"
    with open(log, "wb") as f:
        command = _mpirun(str(PREEMPT_FIT), str(out), "--devices", "2", "--grace", str(grace))
        proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    pid_files = [out / f"rank{rank}.pid" for rank in range(2)]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(p.is_file() and p.read_text() for p in pid_files) or not (out / "rank1.step").is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the job did not start training\n{log.read_text()[-5000:]}")
            time.sleep(0.1)
        ranks = [int(p.read_text()) for p in pid_files]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # mpirun alone, as a scheduler that signals the job's first process
        proc.wait(timeout=2 * sigkill_timeout + 15)
        while _alive(ranks) and time.monotonic() - sent < 2 * sigkill_timeout + 15:
            time.sleep(0.1)
        took = time.monotonic() - sent
        assert not _alive(ranks), log.read_text()[-4000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = log.read_text()
    assert "preempted by SIGTERM: saved" in text, text[-4000:]
    assert all((out / f"rank{rank}.ended").is_file() for rank in range(2)), text[-4000:]  # both left fit() themselves
    info = resume.verify_checkpoint(out / "ckpt" / "last-preempted.ckpt")
    assert info.global_step
    print(f"2 ranks under mpirun, SIGTERM to mpirun: all gone {took:.2f}s after the signal")
