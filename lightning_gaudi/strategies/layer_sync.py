"""Synchronized batch norm on HPUs, real or emulated: what ``Trainer(sync_batchnorm=True)`` gets under HPU."""

from __future__ import annotations

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch.nn import Module
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.emulation import sync_batchnorm


class HPUSyncBatchNorm(TorchSyncBatchNorm):
    """Batch norm statistics over every rank's batch.

    On a Gaudi the batch norms become ``torch.nn.SyncBatchNorm`` (as with Lightning's :class:`TorchSyncBatchNorm`),
    which Intel's bridge runs on the HPU. Under eager emulation, where torch runs ``SyncBatchNorm`` on GPUs only, they
    become :class:`~lightning_gaudi.emulation.sync_batchnorm.EmulatedSyncBatchNorm`, which computes the same statistics
    with gloo all-reduces. :class:`~lightning_gaudi.strategies.HPUParallelStrategy` uses it for
    ``Trainer(sync_batchnorm=True)``; pass it in ``plugins=[...]`` only to subclass it.
    """

    @override
    def apply(self, model: Module) -> Module:
        if hpu.get_backend().emulated:
            return sync_batchnorm.convert(model)
        return super().apply(model)

    @override
    def revert(self, model: Module) -> Module:
        return super().revert(sync_batchnorm.revert(model))
