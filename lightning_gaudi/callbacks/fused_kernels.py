"""The Trainer's spelling of :func:`lightning_gaudi.kernels.fuse_kernels`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn
from typing_extensions import override

from lightning_gaudi.kernels import Factory, Kernels, fuse_kernels


class FusedKernels(Callback):
    """Runs the model's attention, RMSNorm and RoPE on FusedSDPA, FusedRMSNorm and FusedRoPE: at setup,
    :func:`~lightning_gaudi.kernels.fuse_kernels` replaces the modules of the mapped types (call it yourself in
    ``configure_model`` for the modules built there); checkpoints keep their keys.

    Args:
        sdpa: attention on FusedSDPA.
        sdpa_recompute: FusedSDPA's recompute mode (less memory).
        rms_norm, rope: RMSNorm on FusedRMSNorm, rotary embeddings on FusedRoPE.
        mapping: module type -> ``factory(module, kernels)``; the default mapping when ``None``.
    """

    def __init__(
        self,
        sdpa: bool = True,
        sdpa_recompute: bool = True,
        rms_norm: bool = True,
        rope: bool = True,
        mapping: Mapping[type[nn.Module], Factory] | None = None,
    ) -> None:
        Kernels.check_flags(sdpa=sdpa, sdpa_recompute=sdpa_recompute, rms_norm=rms_norm, rope=rope)
        self.sdpa, self.sdpa_recompute, self.rms_norm, self.rope = sdpa, sdpa_recompute, rms_norm, rope
        self.mapping = mapping
        self._kernels: Kernels | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        flags = {"sdpa": self.sdpa, "sdpa_recompute": self.sdpa_recompute, "rms_norm": self.rms_norm, "rope": self.rope}
        self._kernels = fuse_kernels(pl_module, self.mapping, **flags).kernels

    def _warn_fallbacks(self, *args: Any, **kwargs: Any) -> None:  # compiled steps could not warn
        if self._kernels is not None:
            self._kernels.warn_fallbacks()

    on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _warn_fallbacks
