"""The two FP8 formats and per-tensor scaled quantisation into them.

FP8 training (NVIDIA's Transformer Engine and Intel's Gaudi port of it) uses two 8-bit floating-point formats:

- E4M3 (``torch.float8_e4m3fn``): 4 exponent and 3 mantissa bits, largest finite value 448, no infinities. More
  precision, less range: activations and weights in the forward pass.
- E5M2 (``torch.float8_e5m2``): 5 exponent and 2 mantissa bits, largest finite value 57344. More range, less
  precision: gradients in the backward pass of the "hybrid" recipe.

A tensor ``x`` is stored as ``q = fp8(x * scale)`` and read back as ``q / scale``. Values beyond the format's
largest finite value saturate to it (as Transformer Engine does; torch's own cast would turn E5M2 overflow into
infinity). NaN stays NaN, so a diverging run still shows a NaN loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FP8Format:
    """One FP8 format.

    Attributes:
        name: ``"E4M3"`` or ``"E5M2"``.
        dtype: the torch dtype that stores it.
        max: its largest finite value.
    """

    name: str
    dtype: torch.dtype
    max: float


#: E4M3: the forward pass (activations, weights); the backward pass too in the "e4m3" recipe.
E4M3 = FP8Format("E4M3", torch.float8_e4m3fn, torch.finfo(torch.float8_e4m3fn).max)
#: E5M2: gradients in the backward pass of the "hybrid" recipe.
E5M2 = FP8Format("E5M2", torch.float8_e5m2, torch.finfo(torch.float8_e5m2).max)


def quantize(x: Tensor, scale: Tensor, fmt: FP8Format) -> Tensor:
    """``x * scale`` in ``fmt``, saturated at ``fmt.max`` (NaN stays NaN).

    Args:
        x: the values, any floating dtype.
        scale: a per-tensor scale (a 0-dim or broadcastable tensor).
        fmt: :data:`E4M3` or :data:`E5M2`.
    """
    return (x.float() * scale).clamp(-fmt.max, fmt.max).to(fmt.dtype)


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The values ``q`` (from :func:`quantize` with ``scale``) stands for, in ``dtype``."""
    return (q.float() / scale).to(dtype)


def quantize_dequantize(x: Tensor, scale: Tensor, fmt: FP8Format) -> Tensor:
    """What ``x`` becomes through ``fmt`` with ``scale``: :func:`dequantize` of :func:`quantize`, in float32."""
    return dequantize(quantize(x, scale, fmt), scale)


def scale_from_amax(amax: Tensor, fmt: FP8Format, margin: int, previous: Tensor) -> Tensor:
    """The delayed-scaling factor ``fmt.max / amax / 2**margin``: the largest magnitude seen maps to the format's
    largest value, with ``margin`` powers of two of headroom.

    Where ``amax`` is zero, not finite (nothing seen yet, or an overflowed step) or so small that the scale would
    overflow float32, the scale stays ``previous``. Written as arithmetic on masks: every op has a lazy-mode kernel.
    """
    usable = (torch.isfinite(amax) & (amax > fmt.max / _LARGEST_SCALE)).to(previous.dtype)
    fresh = fmt.max / amax.masked_fill(usable < 0.5, 1.0) / (2.0**margin)
    return fresh * usable + previous * (1.0 - usable)


#: Scales stay below this (float32's largest value is about 3.4e38).
_LARGEST_SCALE = 1e38
