"""Training throughput timed on the host, without a host sync per step."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.callbacks.memory_stats import check_interval


def default_batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor in ``batch`` (read from its shape: no device access)."""
    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise ValueError(
            f"HPUThroughputMonitor cannot find a batch dimension in a {type(batch).__name__} batch; pass"
            " `batch_size_fn=lambda batch: ...` returning the number of samples."
        )
    return int(tensor.shape[0])


def default_tokens(batch: Any) -> int | None:
    """The element count of ``batch["input_ids"]``, or ``None``."""
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), Tensor):
        return int(batch["input_ids"].numel())
    return None


def _first_tensor(batch: Any) -> Tensor | None:
    if isinstance(batch, Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


class HPUThroughputMonitor(Callback):
    """Logs ``throughput/samples_per_sec``, ``steps_per_sec`` and ``tokens_per_sec`` per epoch; summarises the fit.

    Host time around training batches after the first ``warmup_steps``; one ``synchronize`` and all-reduce per epoch.
    ``batch_size_fn``/``tokens_fn`` count a batch (default :func:`default_batch_size`, :func:`default_tokens`).
    """

    def __init__(
        self,
        warmup_steps: int = 3,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
    ) -> None:
        check_interval("warmup_steps", warmup_steps, allow_zero=True)
        self.warmup_steps = warmup_steps
        self.batch_size_fn = batch_size_fn or default_batch_size
        self.tokens_fn = tokens_fn or default_tokens
        self.summary: dict[str, float] = {}
        self._reset_fit()

    def _reset_fit(self) -> None:
        self._batches_seen = 0
        self._fit_totals = [0.0, 0.0, 0.0, 0.0]  # seconds, samples, steps, tokens (global)
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._elapsed, self._samples, self._steps, self._tokens, self._step_before = 0.0, 0, 0, 0, 0
        self._has_tokens = False
        self._batch_start: float | None = None
        self._last_end: float | None = None

    def _pause(self, *args: Any, **kwargs: Any) -> None:
        self._last_end = None  # the gap until the next batch is not training time

    on_validation_start = on_save_checkpoint = _pause

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_fit()
        self.summary = {}

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_epoch()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._batches_seen >= self.warmup_steps:
            if self._last_end is not None:
                self._elapsed += now - self._last_end  # data loading between two counted batches
            self._batch_start = now
            self._step_before = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches_seen += 1
        if self._batch_start is None:
            return
        now = time.perf_counter()
        self._elapsed += now - self._batch_start
        self._batch_start = None
        self._last_end = now
        self._samples += self.batch_size_fn(batch)
        self._steps += trainer.global_step - self._step_before
        tokens = self.tokens_fn(batch)
        if tokens is not None:
            self._tokens += tokens
            self._has_tokens = True

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_end is not None:
            hpu.get_backend().synchronize()
            self._elapsed += time.perf_counter() - self._last_end
            self._last_end = None
        if not self._samples:
            return  # the whole epoch was warm-up
        seconds, samples, steps, tokens = self._global(trainer)
        for index, value in enumerate((seconds, samples, steps, tokens)):
            self._fit_totals[index] += value
        metrics = self._rates(seconds, samples, steps, tokens)
        pl_module.log_dict(
            {f"throughput/{name}": value for name, value in metrics.items()},
            on_epoch=True,
            sync_dist=trainer.world_size > 1,  # already global: the mean of equal values, without a warning
        )

    def _global(self, trainer: pl.Trainer) -> tuple[float, float, float, float]:
        if trainer.world_size == 1:
            return self._elapsed, self._samples, self._steps, self._tokens
        device = trainer.strategy.root_device
        counts = torch.tensor([self._samples, self._steps, self._tokens], dtype=torch.float32, device=device)
        elapsed = torch.tensor([self._elapsed], dtype=torch.float32, device=device)
        summed = trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        slowest = trainer.strategy.reduce(elapsed, reduce_op="max").tolist()
        return slowest[0], summed[0], summed[1] / trainer.world_size, summed[2]

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
