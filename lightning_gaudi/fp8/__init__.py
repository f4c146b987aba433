"""FP8 training (``precision="fp8"``) and inference on Intel Gaudi 2 and later, emulated on the CPU."""

from __future__ import annotations

from lightning_gaudi.fp8.convert import FP8_MULTIPLE, Conversion, convert_linear_layers, fp8_compatible
from lightning_gaudi.fp8.formats import E4M3, E5M2, FP8Format
from lightning_gaudi.fp8.inference import finalize_fp8_calibration, prepare_fp8_inference
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
    "finalize_fp8_calibration",
    "fp8_autocast",
    "fp8_compatible",
    "is_fp8_enabled",
    "prepare_fp8_inference",
]
