"""HPUThroughputMonitor: warm-up, validation and checkpoint time left out; no host sync per step; global numbers."""

from __future__ import annotations

import csv
import time
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.workload import CounterWindow, Workload, loader, quiet_trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ThroughputMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import HPUThroughputMonitor
from lightning_gaudi.callbacks.throughput import default_batch_size

PAUSE = 0.75  # 17 steps took 0.27 s on a loaded 2-core machine: well under one pause, even so


class SlowOutsideTraining(Workload):
    """Validation and checkpointing each take PAUSE seconds; a training step takes far less."""

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        time.sleep(PAUSE)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        time.sleep(PAUSE)


def test_eager_counts_after_warmup_without_validation_or_checkpoint_time(
    eager_hpu: hpu.Backend, tmp_path: Path
) -> None:
    monitor = HPUThroughputMonitor(warmup_steps=3)
    trainer = quiet_trainer(
        max_epochs=2,
        callbacks=[monitor, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)],
        enable_checkpointing=True,
        limit_val_batches=1,
        val_check_interval=5,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path, name="", version=""),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(SlowOutsideTraining(), loader(10), loader(1))
    if hasattr(ThroughputMonitor(len), "_module_has_flops"):  # Lightning 2.6 decides once; 2.5 warns at each batch
        assert not [w for w in caught if "flops_per_batch" in str(w.message)], "FLOPs are optional"
    summary = monitor.summary
    assert summary["steps"] == 2 * 10 - 3
    assert summary["samples"] == 4 * (2 * 10 - 3)
    assert summary["seconds"] < PAUSE, "validation and checkpoint time are not training time"
    assert summary["samples_per_sec"] == pytest.approx(summary["samples"] / summary["seconds"])
    assert "tokens_per_sec" not in summary
    with open(tmp_path / "metrics.csv") as f:
        logged = list(csv.DictReader(f))
    rows = [row for row in logged if row.get("throughput/samples_per_sec")]
    assert [int(row["epoch"]) for row in rows] == [0, 1]
    validated = [int(row["validate/samples"]) for row in logged if row.get("validate/samples")]
    assert len(validated) == 4, "validation as Lightning logs it"
    assert validated[0] == 4, "validation as Lightning logs it"  # 2.6 counts each run; 2.5 adds up the epoch's
    assert all(float(row["throughput/steps_per_sec"]) > 0 for row in rows)


class Tokens(Workload):
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self(batch["input_ids"].float()).mean()


def test_tokens_from_input_ids(eager_hpu: hpu.Backend) -> None:
    data = [{"input_ids": torch.ones(8, dtype=torch.long)} for _ in range(12)]  # 3 batches of 4 x 8 tokens
    monitor = HPUThroughputMonitor(warmup_steps=1)
    quiet_trainer(callbacks=[monitor]).fit(Tokens(), DataLoader(data, batch_size=4))
    assert monitor.summary["tokens"] == 2 * 4 * 8
    assert monitor.summary["tokens_per_sec"] == pytest.approx(64 / monitor.summary["seconds"])


def test_lazy_adds_no_host_sync_per_step(lazy_hpu: hpu.Backend) -> None:
    window = CounterWindow(start=4, stop=24)
    monitor = HPUThroughputMonitor()
    quiet_trainer(callbacks=[window, monitor]).fit(Workload(), loader(26))
    assert window.delta("host_syncs") == 0
    assert monitor.summary["steps"] == 26 - 3


def test_global_over_ranks(eager_hpu: hpu.Backend) -> None:
    """Through the hooks only: samples and tokens add up over ranks, steps are per rank, time is the slowest rank's."""
    other_rank = {"sum": torch.tensor([40.0, 10.0, 0.0]), "max": torch.tensor([1000.0])}

    def reduce(tensor: Tensor, reduce_op: str) -> Tensor:
        peer = other_rank[reduce_op]
        return tensor + peer if reduce_op == "sum" else torch.maximum(tensor, peer)

    monitor = HPUThroughputMonitor(warmup_steps=0)
    strategy = SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce)
    trainer: Any = SimpleNamespace(global_step=0, world_size=2, strategy=strategy)
    module: Any = SimpleNamespace(log_dict=lambda metrics, **kwargs: None)
    batch = (torch.zeros(4, 2), torch.zeros(4, 1))
    monitor.on_fit_start(trainer, module)
    monitor.on_train_epoch_start(trainer, module)
    for index in range(10):
        monitor.on_train_batch_start(trainer, module, batch, index)
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, None, batch, index)
    monitor.on_train_epoch_end(trainer, module)
    monitor.on_fit_end(trainer, module)
    assert monitor.summary["samples"] == 40 + 40
    assert monitor.summary["steps"] == 10
    assert monitor.summary["seconds"] == 1000.0  # the slower rank
    assert monitor.summary["samples_per_sec"] == pytest.approx(80 / 1000.0)


@pytest.mark.parametrize("value", [-1, 1.5])
def test_bad_warmup(value: Any) -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        HPUThroughputMonitor(warmup_steps=value)


def test_bridge_synchronizes_once_per_epoch_not_per_step(bridge_double: ModuleType) -> None:
    monitor = HPUThroughputMonitor(warmup_steps=1)
    module = SimpleNamespace(log_dict=lambda metrics, **kwargs: logged.update(metrics))
    logged: dict[str, float] = {}
    trainer: Any = SimpleNamespace(global_step=0, world_size=1)
    monitor.on_fit_start(trainer, module)  # type: ignore[arg-type]
    monitor.on_train_epoch_start(trainer, module)  # type: ignore[arg-type]
    batch = (torch.zeros(4, 2), torch.zeros(4, 1))
    for index in range(5):
        monitor.on_train_batch_start(trainer, module, batch, index)  # type: ignore[arg-type]
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, None, batch, index)  # type: ignore[arg-type]
    assert bridge_double.called("hpu.synchronize") == []
    monitor.on_train_epoch_end(trainer, module)  # type: ignore[arg-type]
    assert len(bridge_double.called("hpu.synchronize")) == 1
    assert logged["throughput/samples_per_sec"] > 0
    monitor.on_fit_end(trainer, module)  # type: ignore[arg-type]
    assert monitor.summary["steps"] == 4


def test_default_batch_size_reads_shapes_and_says_what_to_pass() -> None:
    assert default_batch_size({"input_ids": torch.zeros(6, 8), "labels": [torch.zeros(6)]}) == 6
    with pytest.raises(ValueError, match=r"find a batch dimension in a dict batch.*batch_size_fn=lambda batch"):
        default_batch_size({"ids": None})
