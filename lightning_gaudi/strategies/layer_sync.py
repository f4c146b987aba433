"""Synchronized batch norm on HPUs, real or emulated: what ``Trainer(sync_batchnorm=True)`` gets under HPU."""

from __future__ import annotations

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch.nn import Module
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.emulation import sync_batchnorm


class HPUSyncBatchNorm(TorchSyncBatchNorm):
    """Batch norm statistics over every rank's batch, what ``Trainer(sync_batchnorm=True)`` uses on HPUs:
    ``torch.nn.SyncBatchNorm`` on a Gaudi, :class:`~lightning_gaudi.emulation.sync_batchnorm.EmulatedSyncBatchNorm`
    (gloo all-reduces) in eager emulation."""

    @override
    def apply(self, model: Module) -> Module:
        if hpu.get_backend().emulated:
            return sync_batchnorm.convert(model)
        return super().apply(model)

    @override
    def revert(self, model: Module) -> Module:
        return super().revert(sync_batchnorm.revert(model))
