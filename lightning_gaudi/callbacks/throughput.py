"""Training throughput timed on the host, without a host sync per step."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.callbacks.memory_stats import check_interval


def default_batch_size(batch: Any) -> int:
    """The batch size Lightning's ``extract_batch_size`` reads from the batch's tensors' shapes (no device access)."""
    try:
        return extract_batch_size(batch)
    except MisconfigurationException as error:
        raise ValueError(
            f"HPUThroughputMonitor cannot find a batch dimension in a {type(batch).__name__} batch; pass"
            " `batch_size_fn=lambda batch: ...` returning the number of samples."
        ) from error


def default_tokens(batch: Any) -> int | None:
    """The element count of ``batch["input_ids"]``, or ``None``."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.numel()) if isinstance(ids, Tensor) else None


class HPUThroughputMonitor(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` with training throughput global over ranks, after ``warmup_steps``, without
    validation and checkpointing, and one ``synchronize`` per epoch: it logs ``throughput/samples_per_sec``,
    ``steps_per_sec`` and ``tokens_per_sec``; :attr:`summary` holds the fit's. ``batch_size_fn``/``tokens_fn`` count
    a batch (default :func:`default_batch_size`, :func:`default_tokens`)."""

    def __init__(
        self,
        warmup_steps: int = 3,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
    ) -> None:
        check_interval("warmup_steps", warmup_steps, allow_zero=True)
        super().__init__(batch_size_fn or default_batch_size)
        self.warmup_steps = warmup_steps
        self.tokens_fn = tokens_fn or default_tokens
        self.on_fit_start()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._module_has_flops = hasattr(pl_module, "flops_per_batch")

    @override
    def on_fit_start(self, *args: Any) -> None:
        self.summary: dict[str, float] = {}
        self._fit_totals = [0.0, 0.0, 0.0, 0.0]  # seconds, samples, steps, tokens (global)
        self._batches_seen = 0
        self.on_train_epoch_start()

    @override
    def on_train_epoch_start(self, *args: Any) -> None:
        self._epoch = [0.0, 0.0, 0.0, 0.0]  # seconds, samples, steps, tokens on this rank
        self._has_tokens = False
        self._batch_start: float | None = None
        self._last_end: float | None = None
        self._step_before = 0

    @override
    def on_validation_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._last_end = None  # the gap until the next batch is not training time
        super().on_validation_start(trainer)

    @override
    def on_save_checkpoint(self, *args: Any) -> None:
        self._last_end = None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._batches_seen >= self.warmup_steps:
            if self._last_end is not None:
                self._epoch[0] += now - self._last_end  # data loading between two counted batches
            self._batch_start = now
            self._step_before = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        self._batches_seen += 1
        if self._batch_start is None:
            return
        self._last_end = time.perf_counter()
        tokens = self.tokens_fn(batch)
        self._has_tokens |= tokens is not None
        steps = trainer.global_step - self._step_before
        for index, value in enumerate((self._last_end - self._batch_start, self.batch_size_fn(batch), steps, tokens)):
            self._epoch[index] += value or 0
        self._batch_start = None

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_end is not None:  # the epoch's last batch ends when the device is done
            hpu.get_backend().synchronize()
            self._epoch[0] += time.perf_counter() - self._last_end
            self._last_end = None
        if not self._epoch[1]:
            return  # the whole epoch was warm-up
        totals = self._global(trainer)
        for index, value in enumerate(totals):
            self._fit_totals[index] += value
        pl_module.log_dict(
            {f"throughput/{name}": value for name, value in self._rates(*totals).items()},
            on_epoch=True,
            sync_dist=trainer.world_size > 1,  # already global: the mean of equal values, without a warning
        )

    def _global(self, trainer: pl.Trainer) -> list[float]:
        if trainer.world_size == 1:
            return self._epoch
        device = trainer.strategy.root_device
        counts = torch.tensor(self._epoch[1:], dtype=torch.float32, device=device)
        elapsed = torch.tensor(self._epoch[:1], dtype=torch.float32, device=device)
        samples, steps, tokens = trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        slowest = trainer.strategy.reduce(elapsed, reduce_op="max").item()
        return [slowest, samples, steps / trainer.world_size, tokens]

    def _rates(self, seconds: float, samples: float, steps: float, tokens: float) -> dict[str, float]:
        seconds = max(seconds, 1e-9)
        rates = {"samples_per_sec": samples / seconds, "steps_per_sec": steps / seconds}
        if self._has_tokens:
            rates["tokens_per_sec"] = tokens / seconds
        return rates

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seconds, samples, steps, tokens = self._fit_totals
        if not samples:
            rank_zero_info(
                f"HPUThroughputMonitor: no batch after the {self.warmup_steps} warm-up steps; nothing to report."
            )
            return
        rates = self._rates(*self._fit_totals)
        self.summary = {"seconds": seconds, "samples": samples, "steps": steps, **rates}
        if self._has_tokens:
            self.summary["tokens"] = tokens
        rank_zero_info(
            f"Throughput over {steps:,.0f} steps ({samples:,.0f} samples, {seconds:.2f} s after"
            f" {self.warmup_steps} warm-up steps, without validation and checkpointing): "
            + ", ".join(f"{value:,.1f} {name.replace('_per_sec', '/s')}" for name, value in rates.items())
        )
