"""Mixed precision on the HPU's own autocast device type."""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu

_Precision = Literal["bf16-mixed", "16-mixed"]
_FP16_PRECISIONS = ("16-mixed", "16-true")


def check_precision_supported(precision: str, backend: hpu.Backend | None = None) -> None:
    """Raises a clear error for a precision the HPU (or its emulation) cannot run.

    Raises:
        ValueError: fp16 on first-generation Gaudi, or mixed precision under lazy emulation.
    """
    backend = backend or hpu.get_backend()
    if precision in _FP16_PRECISIONS and not backend.supports_fp16():
        raise ValueError(
            f"`precision={precision!r}` needs float16, which first-generation Gaudi ({backend.device_name()}) does"
            " not have. Use `precision='bf16-mixed'` or 'bf16-true' (every Gaudi runs bfloat16)."
        )
    if precision.endswith("-mixed") and backend.autocast_device_type is None:
        raise ValueError(
            f"`precision={precision!r}` needs torch.autocast, which the {backend.name!r} HPU backend does not have"
            " (torch's Lazy Tensor Core has no autocast). Use `precision='bf16-true'`, or emulate with"
            f" {hpu.EMULATE_ENV}=eager to exercise autocast."
        )


class HPUPrecision(MixedPrecision):
    """Automatic mixed precision with ``torch.autocast`` on the HPU device type.

    On Gaudi autocast runs on device type ``"hpu"``; in eager emulation it is CPU autocast with the same dtype.
    Lazy emulation has no autocast and refuses mixed precision (use ``"bf16-true"`` there).

    Args:
        precision: ``"bf16-mixed"`` (every Gaudi) or ``"16-mixed"`` (Gaudi2 and later, with a gradient scaler).
        scaler: a ``torch.amp.GradScaler`` for ``"16-mixed"``; one is made when not given.

    Raises:
        ValueError: an unsupported precision for this device (see :func:`check_precision_supported`).
    """

    def __init__(self, precision: _Precision = "bf16-mixed", scaler: torch.amp.GradScaler | None = None) -> None:
        if precision not in ("bf16-mixed", "16-mixed"):
            raise ValueError(
                f"HPUPrecision got `precision={precision!r}`; it handles 'bf16-mixed' and '16-mixed'. For"
                " '32-true' or 'bf16-true' pass the string to `Trainer(precision=...)`."
            )
        backend = hpu.get_backend()
        check_precision_supported(precision, backend)
        assert backend.autocast_device_type is not None
        super().__init__(precision, device=backend.autocast_device_type, scaler=scaler)

    @override
    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        if self.scaler is None:
            # Lightning refuses to clip fused optimizers because they unscale gradients themselves; without a
            # scaler (bf16) there is nothing to unscale, and fused optimizers are what Gaudi runs.
            Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
            return
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)
