"""Swaps torch's AdamW/Adam/SGD for Gaudi's fused optimizers, and clipping by norm for the fused clipper."""

from __future__ import annotations

from collections.abc import Iterable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.patches import precision_plugin
from lightning_gaudi.patches.lr_scheduler import rebind_scheduler

#: What each replaceable optimizer keeps, by its torch class name.
_HYPERPARAMETERS = {
    "AdamW": ("lr", "betas", "eps", "weight_decay"),
    "Adam": ("lr", "betas", "eps", "weight_decay"),
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
}
#: Options the fused kernels do not have: a group that turns one on cannot be replaced without changing numerics.
_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable")
_TORCH_CLASSES = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}
REPLACEABLE = tuple(_TORCH_CLASSES)


def _check_replaceable(optimizer: Optimizer) -> str:
    name = type(optimizer).__name__
    if type(optimizer) is not _TORCH_CLASSES.get(name):
        raise ValueError(
            f"FusedOptimizers cannot replace {type(optimizer).__qualname__}: it replaces torch.optim"
            f" {', '.join(REPLACEABLE)} (exactly those classes). Remove FusedOptimizers, or build one of those."
        )
    for index, group in enumerate(optimizer.param_groups):
        on = [option for option in _UNSUPPORTED if group.get(option)]
        if on:
            raise ValueError(
                f"FusedOptimizers cannot replace {name} with {', '.join(f'{o}=True' for o in on)} (param group"
                f" {index}): the fused kernels do not have it. Turn it off or remove FusedOptimizers."
            )
        if name == "Adam" and group["weight_decay"] and not group.get("decoupled_weight_decay"):
            raise ValueError(
                f"FusedOptimizers cannot replace Adam with weight_decay={group['weight_decay']} (param group {index}):"
                " Adam's L2 penalty is not FusedAdamW's decoupled weight decay. Use torch.optim.AdamW (and retune"
                " weight_decay) or remove FusedOptimizers."
            )
    return "SGD" if name == "SGD" else "AdamW"


def fuse_optimizer(optimizer: Optimizer, backend: hpu.Backend | None = None) -> Optimizer:
    """A fused optimizer with ``optimizer``'s param groups and hyperparameters.

    Every hyperparameter is passed explicitly (FusedAdamW's default eps is 1e-6, torch's 1e-8), empty param groups
    are dropped (they crash FusedAdamW) and extra group entries (``initial_lr``, names) are kept.

    Raises:
        ValueError: ``optimizer`` is not a torch AdamW, Adam or SGD, or uses an option the fused kernels lack.
    """
    kind = _check_replaceable(optimizer)
    backend = backend or hpu.get_backend()
    keys = _HYPERPARAMETERS[kind]
    kept = [group for group in optimizer.param_groups if group["params"]]
    groups = [{"params": group["params"], **{key: group[key] for key in keys}} for group in kept]
    defaults = {key: optimizer.defaults[key] for key in keys}
    factory = backend.fused_sgd if kind == "SGD" else backend.fused_adamw
    fused = factory(groups, **defaults)
    for old, new in zip(kept, fused.param_groups, strict=True):
        new.update({key: value for key, value in old.items() if key != "params" and key not in fused.defaults})
    return fused


class FusedOptimizers(Callback):
    """Replaces torch ``AdamW``/``Adam``/``SGD`` from ``configure_optimizers`` with fused ones, before the first step.

    On Gaudi: ``hpex.optimizers.FusedAdamW`` / ``FusedSGD``; in eager emulation torch's ``fused=True`` kernels; in
    lazy emulation torch's single-tensor ones (LTC has no fused kernels). Param groups and hyperparameters are kept
    (eps explicitly), empty param groups dropped, LR schedulers rebound to the new optimizer; on resume the
    checkpoint's optimizer state is loaded into the fused optimizer. With ``Trainer(gradient_clip_val=...)`` and the
    default ``gradient_clip_algorithm="norm"``, gradients are clipped by the fused clipper (``FusedClipNorm`` on Gaudi);
    under ``precision="16-mixed"`` :class:`~lightning_gaudi.precision.HPUPrecision` unscales them first, and steps
    with inf or NaN gradients are still skipped.

    Args:
        optimizers: which torch optimizer classes to replace (names from ``"AdamW"``, ``"Adam"``, ``"SGD"``);
            optimizers of other types are left as they are, with a warning.
        clip_norm: clip by norm with the fused clipper.

    Raises:
        ValueError: an optimizer name it cannot replace; at set-up, FSDP (each rank holds a slice of the
            parameters, which a fused clipper would clip by the slice's own norm, and a param group can be empty on
            one rank; DeepSpeed's engine owns its optimizer and clipping, which this callback then leaves alone); at
            fit start, an optimizer of a listed type with an option the fused kernels lack (``amsgrad``,
            ``maximize``, Adam's coupled ``weight_decay``...).
    """

    def __init__(self, optimizers: Iterable[str] = REPLACEABLE, clip_norm: bool = True) -> None:
        if isinstance(optimizers, str):
            optimizers = [optimizers]
        self.optimizers = tuple(optimizers)
        unknown = [name for name in self.optimizers if name not in _TORCH_CLASSES]
        if unknown:
            raise ValueError(
                f"FusedOptimizers cannot replace {', '.join(map(repr, unknown))}: it replaces torch.optim"
                f" {', '.join(REPLACEABLE)}. Leave {', '.join(unknown)} out of `optimizers`."
            )
        self.clip_norm = clip_norm
        self._clippers: dict[tuple[int, float], tuple[list[Tensor], hpu.ClipNorm]] = {}
        self._clip_override: precision_plugin.Override | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if isinstance(strategy, (FSDPStrategy, ModelParallelStrategy)):
            raise ValueError(
                f"FusedOptimizers does not work with {type(strategy).__name__}: the strategy gives each rank a slice"
                " of the parameters, which the fused clipper would clip by the slice's own norm. Remove the"
                " FusedOptimizers callback (Hydra: `~callbacks.fused_optimizers`); the strategy clips with"
                " `Trainer(gradient_clip_val=...)` by the norm over all ranks."
            )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        backend = hpu.get_backend()
        strategy = trainer.strategy
        optimizers = list(strategy.optimizers)
        for index, optimizer in enumerate(optimizers):
            if type(optimizer).__name__ not in self.optimizers:
                rank_zero_warn(
                    f"FusedOptimizers leaves {type(optimizer).__qualname__} as it is (not in {self.optimizers})."
                )
                continue
            fused = fuse_optimizer(optimizer, backend)
            for config in strategy.lr_scheduler_configs:
                if getattr(config.scheduler, "optimizer", None) is optimizer:
                    rebind_scheduler(config.scheduler, optimizer, fused)
            optimizers[index] = fused
        strategy.optimizers = optimizers
        if self.clip_norm:
            self._install_clipper(trainer, backend)

    def _install_clipper(self, trainer: pl.Trainer, backend: hpu.Backend) -> None:
        plugin = trainer.precision_plugin
        clippers = self._clippers
        clippers.clear()

        def clip_grad_by_norm(optimizer: Optimizer, clip_val: int | float) -> None:
            key = (id(optimizer), float(clip_val))
            bound = clippers.get(key)
            if bound is None:  # once per optimizer: the clipper is bound to its parameters, like FusedClipNorm
                params = [p for group in optimizer.param_groups for p in group["params"]]
                bound = clippers[key] = (params, backend.fused_clip_norm(params, float(clip_val)))
            params, clipper = bound
            clipper.clip_norm(params)

        if not precision_plugin.installed():
            rank_zero_warn(
                "FusedOptimizers leaves gradient clipping to Lightning: this Lightning's precision plugin was not"
                " checked (see the warning from `import lightning_gaudi`)."
            )
            return
        self._clip_override = precision_plugin.override_method(plugin, "clip_grad_by_norm", clip_grad_by_norm)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._clip_override is not None:
            self._clip_override.restore()  # back to the class's method
        self._clip_override = None
        self._clippers.clear()
