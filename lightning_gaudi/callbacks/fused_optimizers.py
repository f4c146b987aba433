"""Deprecated: fused optimizers come from :func:`lightning_gaudi.fuse_optimizer` in ``configure_optimizers``."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_gaudi.optimizers import _FUSED, _TORCH_CLASSES, REPLACEABLE, fuse_optimizer

__all__ = ["REPLACEABLE", "FusedOptimizers", "fuse_optimizer"]


class FusedOptimizers(Callback):
    """Deprecated: call :func:`lightning_gaudi.fuse_optimizer` in ``configure_optimizers`` instead.

    At fit start it replaces the torch ``AdamW``/``Adam``/``SGD`` that ``configure_optimizers`` returned with
    :func:`~lightning_gaudi.fuse_optimizer`'s, when no LR scheduler holds them.

    Args:
        optimizers: names of the torch optimizer classes to replace (``"AdamW"``, ``"Adam"``, ``"SGD"``).
        clip_norm: clip the replacements by norm with the fused clipper.

    Raises:
        ValueError: an optimizer name it cannot replace; at set-up, ``hpu_fsdp``; at fit start, an optimizer an LR
            scheduler holds, or one with an option the fused kernels lack (see :func:`~lightning_gaudi.fuse_optimizer`).
    """

    def __init__(self, optimizers: Iterable[str] = REPLACEABLE, clip_norm: bool = True) -> None:
        warnings.warn(
            "FusedOptimizers is deprecated: return `lightning_gaudi.fuse_optimizer(torch.optim.AdamW(...))` from"
            " configure_optimizers (and build the LR scheduler on it) instead. Hydra: `~callbacks.fused_optimizers`.",
            FutureWarning,
            stacklevel=2,
        )
        self.optimizers = (optimizers,) if isinstance(optimizers, str) else tuple(optimizers)
        unknown = [name for name in self.optimizers if name not in _TORCH_CLASSES]
        if unknown:
            raise ValueError(
                f"FusedOptimizers cannot replace {', '.join(map(repr, unknown))}: it replaces torch.optim"
                f" {', '.join(REPLACEABLE)}. Leave {', '.join(unknown)} out of `optimizers`."
            )
        self.clip_norm = clip_norm

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy)):
            raise ValueError(
                f"FusedOptimizers does not work with {type(trainer.strategy).__name__}: the strategy gives each rank a"
                " slice of the parameters. Remove the FusedOptimizers callback (Hydra: `~callbacks.fused_optimizers`)."
            )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        held = {id(getattr(config.scheduler, "optimizer", None)) for config in strategy.lr_scheduler_configs}
        optimizers = list(strategy.optimizers)
        for index, optimizer in enumerate(optimizers):
            name = type(optimizer).__name__
            if optimizer in _FUSED:
                continue  # from fuse_optimizer already
            if name not in self.optimizers:
                rank_zero_warn(
                    f"FusedOptimizers leaves {type(optimizer).__qualname__} as it is (not in {self.optimizers})."
                )
                continue
            if id(optimizer) in held:
                raise ValueError(
                    f"FusedOptimizers cannot replace the {name} an LR scheduler was built on. In configure_optimizers,"
                    f" build the scheduler on `lightning_gaudi.fuse_optimizer(torch.optim.{name}(...))` and remove"
                    " FusedOptimizers (Hydra: `~callbacks.fused_optimizers`)."
                )
            optimizers[index] = fuse_optimizer(optimizer, clip_norm=self.clip_norm)
        strategy.optimizers = optimizers
