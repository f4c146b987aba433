"""The ``"hpu_single"`` strategy: one process, one HPU."""

from __future__ import annotations

from typing import ClassVar

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.strategies._common import check_hpu_accelerator, prepare_trainer
from lightning_gaudi.strategies._shared import DeviceResolver
from lightning_gaudi.strategies._tied import find_tied_parameters, move_keeping_ties, restore_ties


class SingleHPUStrategy(SingleDeviceStrategy):
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

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator)
        super().__init__(
            device="cpu",
            accelerator=accelerator,
            checkpoint_io=checkpoint_io or HPUCheckpointIO(),
            precision_plugin=precision_plugin,
        )
        self._requested_device = device
        self._devices = DeviceResolver(type(self).__name__)

    @property
    @override
    def root_device(self) -> torch.device:
        return self._devices(self._requested_device)  # asks the backend once, when the environment is final

    @property  # type: ignore[override]
    @override
    def accelerator(self) -> Accelerator | None:
        return self._accelerator

    @accelerator.setter
    @override
    def accelerator(self, accelerator: Accelerator | None) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator)
        self._accelerator = accelerator
        if accelerator is not None:
            self.root_device  # noqa: B018 - a device that is no HPU fails here, while the Trainer is built

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        move_keeping_ties(self.model, self.root_device)  # Module.to alone unties shared weights on lazy tensors

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        hpu.explain_error(exception)  # adds a note to errors that are an emulator's limits; runs only on failure

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        tied = find_tied_parameters(module) if module is not None else []
        super().teardown()  # moves the module back to the CPU, which would untie them again
        if module is not None:
            restore_ties(module, tied)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.lightning_module is not None:
            prepare_trainer(self.lightning_module.trainer)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__name__, override=True)
