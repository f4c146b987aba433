"""Precision for sharded training (``hpu_fsdp``): Lightning's FSDP precision with autocast on the HPU device type."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Literal, get_args

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.precision import check_precision_supported

FSDPPrecisionInput = Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true"]
#: The precisions sharded training runs in on an HPU.
FSDP_PRECISIONS: tuple[str, ...] = get_args(FSDPPrecisionInput)


class HPUFSDPPrecision(FSDPPrecision):
    """Lightning's :class:`~lightning.pytorch.plugins.precision.FSDPPrecision` autocasting on the HPU's device type
    (Lightning's autocasts on CUDA), with its ``16-mixed`` ``ShardedGradScaler`` on that device too.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``; ``"16-mixed"``, ``"16-true"`` on Gaudi 2 and later.
        scaler: a ``ShardedGradScaler`` for ``"16-mixed"``; one on the HPU is made when not given.

    Raises:
        ValueError: another precision, one the device cannot run, or a scaler without ``"16-mixed"``.
    """

    def __init__(self, precision: FSDPPrecisionInput, scaler: ShardedGradScaler | None = None) -> None:
        if precision not in FSDP_PRECISIONS:
            raise ValueError(
                f"HPUFSDPPrecision got `precision={precision!r}`; sharded training on HPUs runs in"
                f" {', '.join(repr(p) for p in FSDP_PRECISIONS)}."
            )
        backend = hpu.get_backend()
        check_precision_supported(precision, backend)
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"`precision={precision!r}` does not use a gradient scaler; got {scaler!r}.")
        self._autocast_device = backend.autocast_device_type
        if scaler is None and precision == "16-mixed":
            assert self._autocast_device is not None  # check_precision_supported refuses mixed precision without it
            scaler = ShardedGradScaler(device=self._autocast_device)
        # Lightning's plugin reads `precision` before setting it, and drops a given scaler (its own is CUDA's)
        self.precision = precision
        super().__init__(precision, scaler)  # type: ignore[arg-type]  # Lightning's private literal is the same set
        self.scaler = scaler

    @property
    def autocast_device(self) -> str | None:
        """The device type mixed precision autocasts on (``None`` where the backend has no autocast)."""
        return self._autocast_device

    def bind(self, module: FullyShardedDataParallel | None) -> None:
        """Sets the root FSDP module whose gradients :meth:`clip_grad_by_norm` clips (the strategy calls this)."""
        self._root = module

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: int | float) -> None:
        """Clips the gradients by their norm over every rank's shards (a collective)."""
        root = getattr(self, "_root", None)
        if root is None:
            super().clip_grad_by_norm(optimizer, clip_val)  # Lightning's error: no sharded module to clip
            return
        root.clip_grad_norm_(clip_val)

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        if "mixed" in self.precision:
            assert self._autocast_device is not None
            dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
            return torch.autocast(self._autocast_device, dtype=dtype)
        return super().forward_context()
