"""Fabric's FP8 precision plugin for HPUs."""

from __future__ import annotations

from lightning.fabric.plugins import Precision

from lightning_gaudi.fp8.precision import FP8PrecisionCore


class HPUFP8Precision(FP8PrecisionCore, Precision):  # type: ignore[misc]
    """Fabric's FP8 training on Gaudi 2 and later, emulated on the CPU elsewhere: the Fabric counterpart of
    :class:`lightning_gaudi.fp8.HPUFP8Precision`. Keep the scaling state across a restart with
    ``fabric.save(path, {"model": model, "fp8": fabric.strategy.precision})``.

    Args:
        recipe: an :class:`~lightning_gaudi.fp8.FP8Recipe`, a mapping of its fields, or ``None`` for the default.

    Raises:
        ValueError: first-generation Gaudi (no FP8), or a bad recipe.
    """
