"""Fabric's FP8 precision plugin for HPUs."""

from __future__ import annotations

from lightning.fabric.plugins import Precision

from lightning_gaudi.fp8.precision import FP8PrecisionCore


class HPUFP8Precision(FP8PrecisionCore, Precision):  # type: ignore[misc]
    """Fabric's FP8 training on Gaudi 2 and later, emulated on the CPU elsewhere.

    The Fabric counterpart of :class:`lightning_gaudi.fp8.HPUFP8Precision`: ``fabric.setup(model)`` swaps the
    ``nn.Linear`` layers whose shapes suit FP8 (``te.Linear`` on a Gaudi, :class:`~lightning_gaudi.fp8.FP8Linear` in
    emulation), the rest runs under bf16 autocast. ``Fabric(accelerator="hpu", precision="fp8")`` uses the default
    recipe; ``plugins=[HPUFP8Precision(recipe={"amax_history_len": 16})]`` another.

    The FP8 scaling state is this plugin's: keep it across a restart with ``fabric.save(path, {"model": model, "fp8":
    fabric.strategy.precision})`` (without it, the scales restart from 1 and settle within a few steps).

    Args:
        recipe: an :class:`~lightning_gaudi.fp8.FP8Recipe`, a mapping of its fields, or ``None`` for the default.

    Raises:
        ValueError: first-generation Gaudi (no FP8), or a bad recipe.
    """
