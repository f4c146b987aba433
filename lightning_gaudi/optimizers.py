"""Gaudi's fused optimizers, built in ``configure_optimizers`` from the torch optimizer they replace."""

from __future__ import annotations

import weakref

import torch
from torch.optim import Optimizer

from lightning_gaudi import hpu

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
#: Every optimizer :func:`fuse_optimizer` made: its fused clippers by ``max_norm``, or ``None`` without fused clipping.
_FUSED: weakref.WeakKeyDictionary[Optimizer, dict[float, hpu.ClipNorm] | None] = weakref.WeakKeyDictionary()


def _check_replaceable(optimizer: Optimizer) -> str:
    name = type(optimizer).__name__
    if type(optimizer) is not _TORCH_CLASSES.get(name):
        raise ValueError(
            f"fuse_optimizer cannot replace {type(optimizer).__qualname__}: it replaces torch.optim"
            f" {', '.join(REPLACEABLE)} (exactly those classes). Return yours as it is, or build one of those."
        )
    for index, group in enumerate(optimizer.param_groups):
        on = [option for option in _UNSUPPORTED if group.get(option)]
        if on:
            raise ValueError(
                f"fuse_optimizer cannot replace {name} with {', '.join(f'{o}=True' for o in on)} (param group"
                f" {index}): the fused kernels do not have it. Turn it off, or return the torch optimizer unfused."
            )
        if name == "Adam" and group["weight_decay"] and not group.get("decoupled_weight_decay"):
            raise ValueError(
                f"fuse_optimizer cannot replace Adam with weight_decay={group['weight_decay']} (param group {index}):"
                " Adam's L2 penalty is not FusedAdamW's decoupled weight decay. Use torch.optim.AdamW (and retune"
                " weight_decay), or return the Adam unfused."
            )
    return "SGD" if name == "SGD" else "AdamW"


def fuse_optimizer(optimizer: Optimizer, clip_norm: bool = True) -> Optimizer:
    """Gaudi's fused optimizer with ``optimizer``'s param groups and hyperparameters; call it in
    ``configure_optimizers`` on a fresh torch ``AdamW``, ``Adam`` (without weight decay) or ``SGD``::

        def configure_optimizers(self):
            optimizer = lightning_gaudi.fuse_optimizer(torch.optim.AdamW(self.parameters(), lr=1e-3))
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

    On Gaudi ``hpex.optimizers.FusedAdamW`` / ``FusedSGD``, in emulation torch's own kernels; empty param groups are
    dropped (they crash FusedAdamW). Not for ``hpu_fsdp`` or DeepSpeed (sliced parameters).

    Args:
        optimizer: the torch optimizer to replace; it is not used afterwards.
        clip_norm: clip by norm with the fused clipper under :class:`~lightning_gaudi.HPUPrecision`.

    Raises:
        ValueError: ``optimizer`` is not a torch AdamW, Adam or SGD, or uses an option the fused kernels lack.
    """
    kind = _check_replaceable(optimizer)
    backend = hpu.get_backend()
    keys = _HYPERPARAMETERS[kind]
    kept = [group for group in optimizer.param_groups if group["params"]]
    groups = [{"params": group["params"], **{key: group[key] for key in keys}} for group in kept]
    defaults = {key: optimizer.defaults[key] for key in keys}
    factory = backend.fused_sgd if kind == "SGD" else backend.fused_adamw
    fused = factory(groups, **defaults)
    for old, new in zip(kept, fused.param_groups, strict=True):
        new.update({key: value for key, value in old.items() if key != "params" and key not in fused.defaults})
    _FUSED[fused] = {} if clip_norm else None
    return fused


def fused_clip_grad_norm(optimizer: Optimizer, max_norm: float) -> bool:
    """Clips ``optimizer``'s gradients by their global 2-norm with its fused clipper (built once per ``max_norm``),
    when it came from :func:`fuse_optimizer` with ``clip_norm=True``; returns whether it did."""
    clippers = _FUSED.get(optimizer)
    if clippers is None:
        return False
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clipper = clippers.get(float(max_norm))
    if clipper is None:
        clipper = clippers[float(max_norm)] = hpu.get_backend().fused_clip_norm(params, float(max_norm))
    clipper.clip_norm(params)
    return True
