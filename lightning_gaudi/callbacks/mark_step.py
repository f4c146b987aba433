"""Where lazy mode cuts the accumulated graph: the one place that decides ``mark_step`` placement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu


class MarkStep(Callback):
    """Calls ``mark_step`` at the points Intel recommends for lazy mode (after backward, the optimizer step and each
    evaluation batch; ``after_forward`` also before backward, optimum-habana's ``pipelining_fwd_bwd``). Does nothing
    outside lazy mode; ``enabled=False`` also stops the HPU strategies adding a default one."""

    def __init__(
        self,
        after_forward: bool = False,
        after_backward: bool = True,
        after_optimizer_step: bool = True,
        after_eval_batch: bool = True,
        enabled: bool = True,
    ) -> None:
        self.after_forward = after_forward
        self.after_backward = after_backward
        self.after_optimizer_step = after_optimizer_step
        self.after_eval_batch = after_eval_batch
        self.enabled = enabled
        self._mark: Callable[[], None] = lambda: None
        self._stepped = False
        self._forward = self._backward = self._step = self._eval = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        backend = hpu.get_backend()
        active = self.enabled and backend.is_lazy()
        self._mark = backend.mark_step
        self._forward = active and self.after_forward
        self._backward = active and self.after_backward
        self._step = active and self.after_optimizer_step
        self._eval = active and self.after_eval_batch
        self._stepped = False

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        if self._forward:
            self._mark()

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._backward:
            self._mark()

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        self._stepped = self._step  # the batch end that follows is the first hook after the step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stepped:
            self._stepped = False
            self._mark()

    def _eval_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self._eval:
            self._mark()

    on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _eval_batch_end


def add_default_mark_step(trainer: pl.Trainer) -> MarkStep | None:
    """In lazy mode, puts a default :class:`MarkStep` first in ``trainer.callbacks`` unless one is configured."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    if not hpu.get_backend().is_lazy() or any(isinstance(c, MarkStep) for c in callbacks):
        return None
    callback = MarkStep()
    callbacks.insert(0, callback)
    return callback
