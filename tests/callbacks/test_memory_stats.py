"""MemoryStats: the three names in a CSV logger's file, at the interval, from rank zero only."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.loggers import CSVLogger, Logger
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import MemoryStats
from lightning_gaudi.callbacks.memory_stats import MEMORY_METRICS, read_memory_metrics
from lightning_gaudi.patches import logging_cadence


def _csv_steps(path: Path, name: str) -> list[int]:
    with open(path / "metrics.csv") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(name)]


@pytest.mark.parametrize("backend", ["eager_hpu", "lazy_hpu"])
def test_keys_in_csv_at_interval(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """An interval of its own follows Lightning's rule at that interval: after every third optimizer step."""
    request.getfixturevalue(backend)
    trainer = quiet_trainer(
        logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=50, callbacks=[MemoryStats(3)]
    )
    trainer.fit(Workload(), loader(7))
    with open(tmp_path / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("memory_allocated (GB)")]
    assert [int(row["step"]) for row in rows] == [2, 5]
    for row in rows:
        allocated, peak, total = (float(row[name]) for name in MEMORY_METRICS)
        assert 0 < allocated <= peak <= total


@pytest.mark.parametrize(("accumulate", "batches", "expected"), [(1, 12, [1, 3, 5, 7, 9, 11]), (3, 13, [1, 3])])
def test_rows_line_up_with_lightnings_own(
    eager_hpu: hpu.Backend, tmp_path: Path, accumulate: int, batches: int, expected: list[int]
) -> None:
    """Memory rows land on the steps Lightning writes the module's own logged metrics at (with accumulation too:
    13 batches accumulated by 3 step at batches 2, 5, 8, 11 and the last one, 12)."""
    reads = []
    memory_stats = eager_hpu.memory_stats

    def counting_memory_stats() -> dict[str, int]:
        reads.append(1)
        return memory_stats()

    eager_hpu.memory_stats = counting_memory_stats  # type: ignore[method-assign]
    try:
        trainer = quiet_trainer(
            logger=CSVLogger(tmp_path, name="", version=""),
            log_every_n_steps=2,
            accumulate_grad_batches=accumulate,
            callbacks=[MemoryStats()],
        )
        trainer.fit(Workload(), loader(batches))
    finally:
        del eager_hpu.memory_stats
    assert _csv_steps(tmp_path, "loss") == expected, "Lightning's own cadence changed: re-check the test"
    assert _csv_steps(tmp_path, "memory_allocated (GB)") == expected
    assert len(reads) == len(expected), "nothing is read between logging steps"


class TwoOptimizers(Workload):
    """Manual optimization with two optimizers: the global step counts both, Lightning's logging step batches."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = ((self(x) - y) ** 2).mean()
        self.log("loss", loss)
        for optimizer in self.optimizers():
            optimizer.zero_grad()
        self.manual_backward(loss)
        for optimizer in self.optimizers():
            optimizer.step()
        return loss

    def configure_optimizers(self) -> Any:
        first, second = self.net[0], self.net[2]
        return torch.optim.SGD(first.parameters(), lr=0.01), torch.optim.SGD(second.parameters(), lr=0.01)


def test_rows_line_up_under_manual_optimization_with_two_optimizers(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    trainer = quiet_trainer(
        logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=3, callbacks=[MemoryStats()]
    )
    trainer.fit(TwoOptimizers(), loader(7))
    assert trainer.global_step == 14
    assert _csv_steps(tmp_path, "loss") == [2, 5]
    assert _csv_steps(tmp_path, "memory_allocated (GB)") == [2, 5]


def test_no_rows_when_lightning_logs_nothing(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    trainer = quiet_trainer(
        logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=0, callbacks=[MemoryStats()]
    )
    trainer.fit(Workload(), loader(4))
    assert not (tmp_path / "metrics.csv").exists() or _csv_steps(tmp_path, "memory_allocated (GB)") == []


class _Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        assert step is not None
        self.logged.append((step, metrics))


def _drive(callback: MemoryStats, steps: range, is_global_zero: bool = True) -> _Recorder:
    logger = _Recorder()
    trainer = SimpleNamespace(global_step=0, is_global_zero=is_global_zero, loggers=[logger], log_every_n_steps=2)
    callback.setup(trainer, None, "fit")  # type: ignore[arg-type]
    for step in steps:
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step)  # type: ignore[arg-type]
    return logger


def test_bridge_values_in_gib(bridge_double: ModuleType) -> None:
    gib = 1024**3
    bridge_double.configure(memory={"InUse": int(1.234 * gib), "MaxInUse": 2 * gib, "Limit": 96 * gib})
    expected = {"memory_allocated (GB)": 1.23, "max_memory_allocated (GB)": 2.0, "total_memory_available (GB)": 96.0}
    assert read_memory_metrics() == expected
    assert len(bridge_double.called("hpu.memory_stats")) == 1


def test_bridge_rank_zero_only(bridge_double: ModuleType) -> None:
    logger = _drive(MemoryStats(1), range(1, 4), is_global_zero=False)
    assert logger.logged == []
    assert bridge_double.called("hpu.memory_stats") == []


@pytest.mark.parametrize("value", [0, -5, 2.5, True])
def test_bad_interval(value: Any) -> None:
    with pytest.raises(ValueError, match="log_every_n_steps"):
        MemoryStats(value)


def test_emulation_reports_host_memory(eager_hpu: hpu.Backend) -> None:
    metrics = read_memory_metrics()
    assert 0 < metrics["memory_allocated (GB)"] < metrics["total_memory_available (GB)"]


@pytest.mark.parametrize(("accumulate", "batches", "expected"), [(1, 6, [1, 3, 5]), (3, 13, [1, 3])])
def test_without_lightnings_cadence_one_optimizer_still_lines_up(
    eager_hpu: hpu.Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    accumulate: int,
    batches: int,
    expected: list[int],
) -> None:
    """On a Lightning the cadence patch was not checked against, the optimizer step stands in for it."""
    monkeypatch.setattr(logging_cadence, "installed", lambda: False)
    trainer = quiet_trainer(
        logger=CSVLogger(tmp_path, name="", version=""),
        log_every_n_steps=2,
        accumulate_grad_batches=accumulate,
        callbacks=[MemoryStats()],
    )
    trainer.fit(Workload(), loader(batches))
    assert _csv_steps(tmp_path, "memory_allocated (GB)") == _csv_steps(tmp_path, "loss") == expected
