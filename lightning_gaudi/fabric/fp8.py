"""Fabric's FP8 precision plugin for HPUs."""

from __future__ import annotations

from lightning.fabric.plugins import Precision

from lightning_gaudi.fp8.precision import FP8PrecisionCore


class HPUFP8Precision(FP8PrecisionCore, Precision):  # type: ignore[misc]
    """Fabric's FP8 training on Gaudi 2 and later, emulated on the CPU elsewhere.

    The Fabric counterpart of :class:`lightning_gaudi.fp8.HPUFP8Precision` (the Trainer's), with the same behaviour:
    ``fabric.setup(model)`` swaps the ``nn.Linear`` layers whose shapes suit FP8 (Intel's ``te.Linear`` on a Gaudi,
    :class:`~lightning_gaudi.fp8.FP8Linear` under emulation) and the model's forward runs in FP8 with bf16 autocast
    for the rest. ``Fabric(accelerator="hpu", precision="fp8")`` builds it with the default recipe::

        Fabric(accelerator="hpu", plugins=[HPUFP8Precision(recipe={"amax_history_len": 16})])

    The model's state dict keeps ``nn.Linear``'s keys; the FP8 scaling state is this plugin's state: to keep it
    across a restart, save and load it with the rest, e.g. ``fabric.save(path, {"model": model, "fp8":
    fabric.strategy.precision})`` (without it, the scales start again from 1 and settle within a few steps).

    Args:
        recipe: an :class:`~lightning_gaudi.fp8.FP8Recipe`, a mapping of its fields, or ``None`` for the default.

    Raises:
        ValueError: first-generation Gaudi (no FP8), or a bad recipe.
    """
