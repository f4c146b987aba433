"""FP8 training on Intel Gaudi 2 and later, with its numerics emulated on the CPU.

- :class:`HPUFP8Precision`: the Trainer's plugin, ``Trainer(accelerator="hpu", precision="fp8")``
  (:class:`lightning_gaudi.fabric.HPUFP8Precision` for Fabric, ``Fabric(accelerator="hpu", precision="fp8")``);
- :class:`FP8Recipe`: formats ("hybrid": E4M3 forward, E5M2 gradients; or "e4m3") and delayed scaling;
- :class:`FP8Linear` and :func:`fp8_autocast`: the emulated FP8 layer and the context it computes in FP8 in;
- :func:`convert_linear_layers`: the layer swap (weights kept, state-dict keys unchanged);
- :mod:`~lightning_gaudi.fp8.formats`: E4M3 and E5M2, and per-tensor scaled quantisation.
"""

from __future__ import annotations

from lightning_gaudi.fp8.convert import FP8_MULTIPLE, Conversion, convert_linear_layers, fp8_compatible
from lightning_gaudi.fp8.formats import E4M3, E5M2, FP8Format
from lightning_gaudi.fp8.linear import FP8Linear, fp8_autocast, is_fp8_enabled
from lightning_gaudi.fp8.precision import HPUFP8Precision
from lightning_gaudi.fp8.recipe import FP8Recipe
from lightning_gaudi.fp8.training import FP8Training

__all__ = [
    "E4M3",
    "E5M2",
    "FP8_MULTIPLE",
    "Conversion",
    "FP8Format",
    "FP8Linear",
    "FP8Recipe",
    "FP8Training",
    "HPUFP8Precision",
    "convert_linear_layers",
    "fp8_autocast",
    "fp8_compatible",
    "is_fp8_enabled",
]
