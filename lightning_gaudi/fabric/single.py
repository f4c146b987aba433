"""Fabric's ``"hpu_single"`` strategy: one process, one HPU."""

from __future__ import annotations

from typing import ClassVar

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO, Precision
from lightning.fabric.strategies import SingleDeviceStrategy, Strategy

from lightning_gaudi.fabric._base import FabricCore
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import SingleDeviceCore


class SingleHPUStrategy(SingleDeviceCore, FabricCore, SingleDeviceStrategy):
    """Fabric's counterpart of :class:`lightning_gaudi.SingleHPUStrategy`, with its arguments (``precision`` for
    ``precision_plugin``) and ``mark_step`` (:class:`~lightning_gaudi.fabric._base.FabricCore`)."""

    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (SingleDeviceStrategy,)
    adoption = Adoption(renamed={"device": "_root_device"})

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        mark_step: bool = True,
    ) -> None:
        self._requested_device = device
        super().__init__(
            device="cpu",
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision=precision,
            mark_step=mark_step,
        )
