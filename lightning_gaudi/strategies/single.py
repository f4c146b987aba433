"""The ``"hpu_single"`` strategy: one process, one HPU."""

from __future__ import annotations

from typing import ClassVar

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy

from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import SingleDeviceCore, TrainerCore


class SingleHPUStrategy(SingleDeviceCore, TrainerCore, SingleDeviceStrategy):
    """Trains on one HPU (real or emulated).

    Args:
        device: the device to train on; by default the card this process drives.
        accelerator, checkpoint_io: as every HPU strategy (:class:`~lightning_gaudi.strategies.core.HPUStrategyCore`).
        precision_plugin: e.g. :class:`~lightning_gaudi.precision.HPUPrecision`.
    """

    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (SingleDeviceStrategy,)
    adoption = Adoption(renamed={"device": "_root_device"})

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        self._requested_device = device
        super().__init__(
            device="cpu",
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
