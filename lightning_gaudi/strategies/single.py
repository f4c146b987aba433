"""The ``"hpu_single"`` strategy: one process, one HPU."""

from __future__ import annotations

from typing import ClassVar

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy
from typing_extensions import override

from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import TrainerCore


class SingleHPUStrategy(TrainerCore, SingleDeviceStrategy):
    """Trains on one HPU (real or emulated).

    Args:
        device: the device to train on; by default the card this process drives. In emulation an ``"hpu"`` device
            means the emulated one.
        accelerator: normally left to the Trainer (``accelerator="hpu"``).
        checkpoint_io: defaults to :class:`~lightning_gaudi.checkpoint_io.HPUCheckpointIO` (CPU tensors, atomic).
        precision_plugin: e.g. :class:`~lightning_gaudi.precision.HPUPrecision`.
    """

    strategy_name = "hpu_single"
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

    @property
    @override
    def root_device(self) -> torch.device:
        return self._hpu_device(self._requested_device)  # asks the backend once, when the environment is final

    @override
    def _check_runnable(self) -> None:
        self.root_device  # noqa: B018 - a device that is no HPU fails here, while the Trainer is built
