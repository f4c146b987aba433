"""Synchronized batch norm on HPUs: what ``Trainer(sync_batchnorm=True)`` gets under HPU."""

from __future__ import annotations

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch.nn import Module
from typing_extensions import override

from lightning_gaudi import hpu


class HPUSyncBatchNorm(TorchSyncBatchNorm):
    """Batch norm statistics over every rank's batch, what ``Trainer(sync_batchnorm=True)`` uses on HPUs: the
    backend's (:meth:`~lightning_gaudi.hpu.Backend.convert_sync_batchnorm`: ``torch.nn.SyncBatchNorm`` on a
    Gaudi)."""

    @override
    def apply(self, model: Module) -> Module:
        return hpu.get_backend().convert_sync_batchnorm(model)

    @override
    def revert(self, model: Module) -> Module:
        return super().revert(hpu.get_backend().revert_sync_batchnorm(model))
