"""MemoryStats: the three names in a CSV logger's file, at the interval, from rank zero only."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.loggers import CSVLogger, Logger

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import MemoryStats
from lightning_gaudi.callbacks.memory_stats import MEMORY_METRICS


@pytest.mark.parametrize("backend", ["eager_hpu", "lazy_hpu"])
def test_keys_in_csv_at_interval(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    request.getfixturevalue(backend)
    trainer = quiet_trainer(
        logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=50, callbacks=[MemoryStats(3)]
    )
    trainer.fit(Workload(), loader(7))
    with open(tmp_path / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("memory_allocated (GB)")]
    assert [int(row["step"]) for row in rows] == [3, 6]
    for row in rows:
        allocated, peak, total = (float(row[name]) for name in MEMORY_METRICS)
        assert 0 < allocated <= peak <= total


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
    logger = _drive(MemoryStats(), range(1, 6))  # the Trainer's interval (2 here)
    expected = {"memory_allocated (GB)": 1.23, "max_memory_allocated (GB)": 2.0, "total_memory_available (GB)": 96.0}
    assert logger.logged == [(2, expected), (4, expected)]
    assert len(bridge_double.called("hpu.memory_stats")) == 2, "nothing is read between logging steps"


def test_bridge_rank_zero_only(bridge_double: ModuleType) -> None:
    logger = _drive(MemoryStats(1), range(1, 4), is_global_zero=False)
    assert logger.logged == []
    assert bridge_double.called("hpu.memory_stats") == []


@pytest.mark.parametrize("value", [0, -5, 2.5, True])
def test_bad_interval(value: Any) -> None:
    with pytest.raises(ValueError, match="log_every_n_steps"):
        MemoryStats(value)


def test_emulation_reports_host_memory(eager_hpu: hpu.Backend) -> None:
    from lightning_gaudi.callbacks.memory_stats import read_memory_metrics

    metrics = read_memory_metrics()
    assert 0 < metrics["memory_allocated (GB)"] < metrics["total_memory_available (GB)"]
