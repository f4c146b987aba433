"""Fabric's mixed precision on the HPU's own autocast device type."""

from __future__ import annotations

from typing import Literal

import torch
from lightning.fabric.plugins import MixedPrecision, Precision
from lightning.pytorch.plugins.precision import Precision as TrainerPrecision
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.precision import autocast_device, check_precision_supported

_Precision = Literal["bf16-mixed", "16-mixed"]


def check_precision_plugin(plugin: Precision, backend: hpu.Backend | None = None) -> None:
    """Raises ``ValueError`` for a Fabric precision plugin ``backend`` (default: the current HPU) cannot run."""
    backend = backend or hpu.get_backend()
    name = str(plugin.precision)
    if isinstance(plugin, TrainerPrecision):
        raise ValueError(
            f"{type(plugin).__name__} (precision {name!r}) is a precision plugin of the Trainer's; Fabric calls its"
            f" plugins differently. Use `Fabric(precision={name!r})` or, for mixed precision,"
            f" `lightning_gaudi.fabric.HPUPrecision(...)`."
        )
    autocast = backend.autocast_device_type
    if isinstance(plugin, MixedPrecision) and autocast is not None and plugin.device != autocast:
        raise ValueError(
            f"{type(plugin).__name__} (precision {name!r}) autocasts on {plugin.device!r}, not on the HPU. Use"
            f" `lightning_gaudi.fabric.HPUPrecision({name!r})` or `Fabric(precision={name!r})`."
        )
    check_precision_supported(name, backend)


class HPUPrecision(MixedPrecision):
    """Fabric's counterpart of :class:`lightning_gaudi.HPUPrecision`, with the same arguments."""

    def __init__(self, precision: _Precision = "bf16-mixed", scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__(precision, device=autocast_device(precision, "Fabric"), scaler=scaler)

    @override
    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Unscales the gradients before ``fabric.clip_gradients``, fused optimizers' too (Lightning refuses them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
