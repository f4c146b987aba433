"""A finished job exits 0 on every rank, through the interpreter's normal exit: torchrun and SLURM restart policies
read a rank's abort at teardown ("terminate called without an active exception", 134) as a failed job and requeue a
job that had finished. Tensor parallelism (DTensor) and ZeRO-3 are the runs that aborted now and then on torch 2.13:
each runs under torchrun, which reports every rank's exit code, once in the suite (the torchrun jobs that
tests/strategies/test_model_parallel.py and test_deepspeed_emulated.py read: every layout, ZeRO-2 and ZeRO-3 fits and
resumes) and as often more as LIGHTNING_GAUDI_TEST_EXIT_RUNS says for a statistical check (the issue's: 8). The
cause (a gloo worker that lets go of a finished collective during the interpreter's finalization) is reproduced
deterministically in tests/distributed/test_shutdown.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import hpu
from strategies.test_deepspeed_emulated import deepspeed_job
from strategies.test_model_parallel import layouts_job

HELPERS_DIR = Path(__file__).parents[1] / "helpers"
RUNS = int(os.environ.get("LIGHTNING_GAUDI_TEST_EXIT_RUNS", "1"))


def _torchrun(out: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK"):
        env.pop(name, None)
    env.pop("DS_ACCELERATOR", None)
    env.update({hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1"})
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["--monitor-interval", "0.2", str(HELPERS_DIR / script), str(out), *args]
    return subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=300)


def _assert_every_run_exits_0(tmp_path: Path, job: Callable[[], Path], script: str, *args: str) -> None:
    """``job()``: the suite's torchrun job of this kind, run once per pytest run (it fails, naming the exit code, if
    that is not 0); the further runs, ``RUNS`` in all, start ``script`` here."""
    failed = []
    stderr = (job() / "stderr.txt").read_text()
    if "terminate called" in stderr:
        failed.append(f"run 0: the shared job\n{stderr[-3000:]}")
    for run in range(1, RUNS):
        proc = _torchrun(tmp_path / f"run{run}", script, *args)
        if proc.returncode != 0 or "terminate called" in proc.stderr:
            failed.append(f"run {run}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    assert not failed, f"{len(failed)} of {RUNS} finished runs did not exit 0:\n" + "\n".join(failed)


@pytest.mark.subprocess
def test_a_tensor_parallel_job_exits_0_every_time(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    job = partial(layouts_job, tmp_path_factory)
    _assert_every_run_exits_0(tmp_path, job, "model_parallel_fit.py", "fit", "1", "2", "tp", "2")


@pytest.mark.subprocess
@pytest.mark.skipif(not RequirementCache("deepspeed"), reason="DeepSpeed is not installed (scripts/setup.sh installs)")
def test_a_zero3_job_exits_0_every_time(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    job = partial(deepspeed_job, tmp_path_factory)
    _assert_every_run_exits_0(tmp_path, job, "deepspeed_fit.py", "hpu_deepspeed_stage_3", "short")
