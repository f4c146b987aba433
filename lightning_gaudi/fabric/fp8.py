"""Fabric's FP8 precision plugin for HPUs."""

from __future__ import annotations

from lightning.fabric.plugins import Precision

from lightning_gaudi.fp8.precision import FP8PrecisionCore


class HPUFP8Precision(FP8PrecisionCore, Precision):  # type: ignore[misc]
    """Fabric's counterpart of :class:`lightning_gaudi.fp8.HPUFP8Precision`, with the same arguments; keep the scaling
    state with ``fabric.save(path, {"model": model, "fp8": fabric.strategy.precision})``."""
