"""The process group's end at exit (``lightning_gaudi/distributed/shutdown.py``, issue 32 item 6): a last barrier whose
work is kept, then ``destroy_process_group``; none of it when the run failed. The 2-process test reproduces the abort
at teardown deterministically; ``tests/strategies/test_clean_exit.py`` runs whole jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from lightning.pytorch import Trainer

from lightning_gaudi import hpu
from lightning_gaudi.distributed import rendezvous, shutdown
from lightning_gaudi.distributed.launcher import free_port
from lightning_gaudi.strategies import core

HELPERS_DIR = Path(__file__).parents[1] / "helpers"
TIMEOUT = timedelta(seconds=30)


@pytest.fixture
def exit_state(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The module's state, fresh for the test and put back after it; returns the list of kept works."""
    kept: list[Any] = []
    monkeypatch.setattr(shutdown, "_KEPT", kept)
    monkeypatch.setattr(shutdown, "_failed", False)
    monkeypatch.delattr(sys, "last_value", raising=False)
    return kept


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone (destroyed after the test if the test did not)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_exit_waits_for_a_last_barrier_keeps_its_work_and_destroys_the_group(
    exit_state: list[Any], one_rank_group: None
) -> None:
    shutdown.close_process_group(TIMEOUT)
    assert not dist.is_initialized()
    assert len(exit_state) == 1
    assert exit_state[0].is_completed()


def test_a_failed_run_skips_the_barrier(exit_state: list[Any], one_rank_group: None) -> None:
    shutdown.mark_failed()
    shutdown.close_process_group(TIMEOUT)
    assert not dist.is_initialized()
    assert exit_state == []


def test_an_uncaught_exception_skips_the_barrier(
    exit_state: list[Any], one_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "last_value", RuntimeError("the script failed"), raising=False)
    shutdown.close_process_group(TIMEOUT)
    assert not dist.is_initialized()
    assert exit_state == []


def test_without_a_group_exit_does_nothing(exit_state: list[Any]) -> None:
    assert not dist.is_initialized()
    shutdown.close_process_group(TIMEOUT)
    assert exit_state == []


def test_forming_the_group_registers_the_exit_and_a_failure_marks_the_run(
    eager_hpu: hpu.Backend, exit_state: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[tuple[Any, ...]] = []
    formed: list[dict[str, Any]] = []
    monkeypatch.setattr(core.atexit, "register", lambda *args: registered.append(args))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(formed))
    monkeypatch.setattr(rendezvous, "init_process_group", lambda backend, **kwargs: formed.append(kwargs))
    strategy = Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, logger=False).strategy
    strategy.setup_distributed()
    assert registered == [(shutdown.close_process_group, shutdown.exit_timeout(strategy.timeout))]
    strategy.on_exception(RuntimeError("a step failed"))
    assert shutdown._failed
    # the next run in this process (a notebook's next fit) ends with the barrier again if it succeeds
    Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, logger=False).strategy.setup_distributed()
    assert not shutdown._failed


@pytest.mark.subprocess
def test_a_collective_that_ends_during_the_exit_does_not_abort_it(tmp_path: Path) -> None:
    """Rank 1 aborted here on every run with the former exit hook (``destroy_process_group`` alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    command = [sys.executable, str(HELPERS_DIR / "exit_race.py"), "0.5", "60000000"]
    procs = [
        subprocess.Popen(command, env={**env, "RANK": str(rank)}, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    stderrs = [proc.communicate(timeout=180)[1] for proc in procs]
    for rank, (proc, stderr) in enumerate(zip(procs, stderrs, strict=True)):
        assert "terminate called" not in stderr, f"rank {rank} aborted at exit:\n{stderr[-3000:]}"
        assert proc.returncode == 0, f"rank {rank}: exit code {proc.returncode}\n{stderr[-3000:]}"
