"""Synchronized batch norm under eager emulation, where torch refuses ``SyncBatchNorm`` on the CPU: the global mean and
variance from two differentiable all-reduces, with torch's semantics."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import Function
from torch.nn import Module
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm


class _AllReduceSum(Function):
    """``all_reduce(SUM)`` with a gradient: the gradient of a sum over ranks is the sum of the ranks' gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        result = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(result, op=dist.ReduceOp.SUM, group=group)
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _AllReduceSum.apply(grad, ctx.group), None


class EmulatedSyncBatchNorm(_BatchNorm):
    """``torch.nn.SyncBatchNorm`` on CPU tensors, with its arguments; plain batch norm outside training or without
    two or more ranks. Build it with :func:`convert`; :func:`revert` undoes it."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group
        self.reverts_to: type[torch.nn.Module] = torch.nn.SyncBatchNorm

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        tracked = not self.training or self.track_running_stats
        running_mean = self.running_mean if tracked else None
        running_var = self.running_var if tracked else None
        group = self.process_group or dist.group.WORLD
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1):
            use_batch = self.training or (self.running_mean is None and self.running_var is None)
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, use_batch, factor, self.eps)
        return self.synced(input, running_mean, running_var, factor, group)

    def synced(
        self, input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, factor: float, group: Any
    ) -> Tensor:
        """Batch norm with the mean and variance over every rank of ``group``; updates the running statistics."""
        channels = input.size(1)
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.full((1,), input.numel() // channels, dtype=x.dtype, device=x.device)
        totals = _AllReduceSum.apply(torch.cat([x.sum(dims), count]), group)
        n = totals[channels]
        mean = totals[:channels] / n
        centered = x - mean.view(shape)
        var = _AllReduceSum.apply(centered.square().sum(dims), group) / n
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape)
        if self.bias is not None:
            out = out + self.bias.view(shape)
        with torch.no_grad():
            if running_mean is not None:
                running_mean.lerp_(mean.to(running_mean.dtype), factor)
            if running_var is not None:
                unbiased = var * n / (n - 1).clamp(min=1)
                running_var.lerp_(unbiased.to(running_var.dtype), factor)
        return out.to(input.dtype)


def _move_state(source: _BatchNorm, target: _BatchNorm) -> _BatchNorm:
    if source.affine:
        with torch.no_grad():
            target.weight = source.weight
            target.bias = source.bias
    target.running_mean = source.running_mean
    target.running_var = source.running_var
    target.num_batches_tracked = source.num_batches_tracked
    target.train(source.training)
    if hasattr(source, "qconfig"):
        target.qconfig = source.qconfig
    return target


def _arguments(module: _BatchNorm) -> dict[str, Any]:
    return {
        "num_features": module.num_features,
        "eps": module.eps,
        "momentum": module.momentum,
        "affine": module.affine,
        "track_running_stats": module.track_running_stats,
    }


def convert(module: Module, process_group: Any | None = None) -> Module:
    """``module`` with every batch norm an :class:`EmulatedSyncBatchNorm` sharing its parameters and buffers."""
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, EmulatedSyncBatchNorm):
        synced = EmulatedSyncBatchNorm(**_arguments(module), process_group=process_group)
        synced.reverts_to = type(module)
        converted = _move_state(module, synced)
    for name, child in module.named_children():
        converted.add_module(name, convert(child, process_group))
    return converted


def revert(module: Module) -> Module:
    """``module`` with every :class:`EmulatedSyncBatchNorm` back to the class it was converted from."""
    reverted = module
    if isinstance(module, EmulatedSyncBatchNorm):
        original: Any = module.reverts_to
        extra = {"process_group": module.process_group} if issubclass(original, torch.nn.SyncBatchNorm) else {}
        reverted = _move_state(module, original(**_arguments(module), **extra))
    for name, child in module.named_children():
        reverted.add_module(name, revert(child))
    return reverted
