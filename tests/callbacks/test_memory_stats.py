"""MemoryStats: Lightning's DeviceStatsMonitor over the HPU's memory statistics, on Lightning's logging steps only."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import MemoryStats

END = "MemoryStats.on_train_batch_end/hpu/"


def _rows(path: Path, name: str) -> list[dict[str, str]]:
    with open(path / "metrics.csv") as f:
        return [row for row in csv.DictReader(f) if row.get(name)]


def _steps(path: Path, name: str) -> list[int]:
    return [int(row["step"]) for row in _rows(path, name)]


def _fit(tmp_path: Path, model: Workload, batches: int, val_batches: int = 0, **kwargs: Any) -> Any:
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="", version=""), callbacks=[MemoryStats()], **kwargs)
    trainer.fit(model, loader(batches), loader(val_batches) if val_batches else None)
    return trainer


@pytest.mark.parametrize("backend", ["eager_hpu", "lazy_hpu"])
def test_memory_in_csv_on_logging_steps(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    request.getfixturevalue(backend)
    _fit(tmp_path, Workload(), 7, val_batches=3, log_every_n_steps=3, limit_val_batches=3, val_check_interval=3)
    assert _steps(tmp_path, "loss") == [2, 5]
    assert _steps(tmp_path, f"{END}InUse (GiB)") == [2, 5]  # one row a logging step, none per validation batch
    with open(tmp_path / "metrics.csv") as f:
        assert not [key for key in next(csv.reader(f)) if "MemoryStats" in key and not key.startswith(END)]
    for row in _rows(tmp_path, f"{END}InUse (GiB)"):
        allocated, peak, total = (float(row[f"{END}{key} (GiB)"]) for key in ("InUse", "MaxInUse", "Limit"))
        assert 0 < allocated <= peak <= total


@pytest.mark.parametrize(("accumulate", "batches", "expected"), [(1, 12, [1, 3, 5, 7, 9, 11]), (3, 13, [1, 3])])
def test_rows_line_up_and_nothing_is_read_between_logging_steps(
    eager_hpu: hpu.Backend, tmp_path: Path, accumulate: int, batches: int, expected: list[int]
) -> None:
    """Memory rows land on the steps Lightning writes the module's own logged metrics at (with accumulation, once per
    micro-batch of those steps), and the statistics are read on those steps only, at batch end: other steps stay free
    of host work."""
    reads = []
    memory_stats = eager_hpu.memory_stats

    def counting_memory_stats() -> dict[str, int]:
        reads.append(1)
        return memory_stats()

    eager_hpu.memory_stats = counting_memory_stats  # type: ignore[method-assign]
    try:
        _fit(tmp_path, Workload(), batches, log_every_n_steps=2, accumulate_grad_batches=accumulate)
    finally:
        del eager_hpu.memory_stats
    assert _steps(tmp_path, "loss") == expected
    assert sorted(set(_steps(tmp_path, f"{END}InUse (GiB)"))) == expected
    assert len(reads) == accumulate * len(expected), f"{len(reads)} reads in {batches} batches"


def test_no_rows_when_lightning_logs_nothing(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    _fit(tmp_path, Workload(), 4, log_every_n_steps=0)
    assert not (tmp_path / "metrics.csv").exists() or _steps(tmp_path, f"{END}InUse (GiB)") == []


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
    trainer = _fit(tmp_path, TwoOptimizers(), 7, log_every_n_steps=3)
    assert trainer.global_step == 14
    assert _steps(tmp_path, "loss") == _steps(tmp_path, f"{END}InUse (GiB)") == [2, 5]


def test_is_lightnings_device_stats_monitor_and_needs_no_logger(eager_hpu: hpu.Backend) -> None:
    assert isinstance(MemoryStats(cpu_stats=False), DeviceStatsMonitor)
    trainer = quiet_trainer(max_steps=2, callbacks=[MemoryStats()])
    with pytest.warns(UserWarning, match="MemoryStats logs nothing: the Trainer has no logger"):
        trainer.fit(Workload(), loader(2))
    assert trainer.global_step == 2


def test_the_interval_is_the_trainers() -> None:
    with pytest.raises(TypeError, match="log_every_n_steps"):
        MemoryStats(log_every_n_steps=7)  # type: ignore[call-arg]
