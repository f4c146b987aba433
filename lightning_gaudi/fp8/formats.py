"""The FP8 formats (E4M3 forward, E5M2 gradients under "hybrid") and per-tensor scaled quantisation into them:
``q = fp8(x * scale)``, read back as ``q / scale``; overflow saturates (as in Transformer Engine), NaN stays NaN."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FP8Format:
    """One FP8 format: its name, the torch dtype that stores it and its largest finite value."""

    name: str
    dtype: torch.dtype
    max: float


#: E4M3: the forward pass (activations, weights); the backward pass too in the "e4m3" recipe.
E4M3 = FP8Format("E4M3", torch.float8_e4m3fn, torch.finfo(torch.float8_e4m3fn).max)
#: E5M2: gradients in the backward pass of the "hybrid" recipe.
E5M2 = FP8Format("E5M2", torch.float8_e5m2, torch.finfo(torch.float8_e5m2).max)


def quantize(x: Tensor, scale: Tensor, fmt: FP8Format) -> Tensor:
    """``x * scale`` in ``fmt``, saturated at ``fmt.max`` (NaN stays NaN); ``scale`` is 0-dim or broadcastable."""
    return (x.float() * scale).clamp(-fmt.max, fmt.max).to(fmt.dtype)


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The values ``q`` (from :func:`quantize` with ``scale``) stands for, in ``dtype``."""
    return (q.float() / scale).to(dtype)


def quantize_dequantize(x: Tensor, scale: Tensor, fmt: FP8Format) -> Tensor:
    """What ``x`` becomes through ``fmt`` with ``scale``: :func:`dequantize` of :func:`quantize`, in float32."""
    return dequantize(quantize(x, scale, fmt), scale)


def scale_from_amax(amax: Tensor, fmt: FP8Format, margin: int, previous: Tensor) -> Tensor:
    """The delayed-scaling factor ``fmt.max / amax / 2**margin``, or ``previous`` where ``amax`` is zero, not
    finite or too small (the scale would overflow float32). Mask arithmetic: every op has a lazy-mode kernel."""
    usable = (torch.isfinite(amax) & (amax > fmt.max / _LARGEST_SCALE)).to(previous.dtype)
    fresh = fmt.max / amax.masked_fill(usable < 0.5, 1.0) / (2.0**margin)
    return fresh * usable + previous * (1.0 - usable)


#: Scales stay below this (float32's largest value is about 3.4e38).
_LARGEST_SCALE = 1e38
