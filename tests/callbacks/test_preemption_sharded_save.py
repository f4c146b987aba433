"""A grace period that runs out during a sharded save leaves no staging folder behind (``PreemptionCheckpoint``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from callbacks.test_preemption import SIGTERM_EXIT, Job


@pytest.mark.subprocess
def test_a_grace_period_ending_during_a_sharded_save_leaves_no_staging_folder(tmp_path: Path) -> None:
    grace = 2.0
    job = Job(tmp_path / "job", "--grace", str(grace), "--slow-save", "30", "--strategy", "hpu_fsdp_sharded_checkpoint")
    os.killpg(job.proc.pid, signal.SIGTERM)
    job.wait_gone(within=grace + 8)  # the grace period, then the interpreter's exit on a busy machine
    log = job.log.read_text()
    assert job.proc.returncode == SIGTERM_EXIT, log[-4000:]
    assert "grace period of 2s ran out while saving" in log
    ckpt = job.out / "ckpt"
    leftovers = sorted(p.name for p in ckpt.iterdir()) if ckpt.exists() else []
    assert leftovers == [], f"a grace period that ran out during a sharded save left {leftovers}"


@pytest.mark.subprocess
def test_a_grace_period_ending_first_on_rank_1_ends_every_rank_143(tmp_path: Path) -> None:
    """Rank 1 alone gets the signal, so its grace period ends first: rank 0 (Lightning's launcher) ends 143 too, with
    its staging folder removed; Lightning's observer SIGKILLed it (-9) when it saw rank 1's 143 first."""
    grace = 2.0
    job = Job(tmp_path / "job", "--grace", str(grace), "--slow-save", "30", "--strategy", "hpu_fsdp_sharded_checkpoint")
    os.kill(job.pids[1], signal.SIGTERM)
    job.wait_gone(within=grace + 10)
    log = job.log.read_text()
    assert job.proc.returncode == SIGTERM_EXIT, log[-4000:]
    ckpt = job.out / "ckpt"
    leftovers = sorted(p.name for p in ckpt.iterdir()) if ckpt.exists() else []
    assert leftovers == [], f"a grace period that ran out during a sharded save left {leftovers}"
