"""Mixed precision on the HPU's own autocast device type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import Optimizable
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu

_Precision = Literal["bf16-mixed", "16-mixed"]
_FP16_PRECISIONS = ("16-mixed", "16-true")
#: Every precision lightning_gaudi trains in, in the order errors list them (see :func:`supported_precisions`).
HPU_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "fp8")
#: Lightning's short precision names, as its Trainer reads them.
_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
_HINTS = {
    "transformer-engine": " Lightning's transformer-engine precision drives NVIDIA's Transformer Engine on CUDA."
    " For FP8 training on Gaudi 2 and later (Intel's Transformer Engine port, emulated on the CPU) use"
    " `precision='fp8'` (lightning_gaudi.fp8.HPUFP8Precision).",
}


def supported_precisions(backend: hpu.Backend | None = None) -> tuple[str, ...]:
    """The precisions this HPU runs: :data:`HPU_PRECISIONS` less fp16 and fp8 on first-generation Gaudi and mixed
    precision under lazy emulation (no autocast there)."""
    backend = backend or hpu.get_backend()
    fp16 = backend.supports_fp16()
    fp8 = backend.supports_fp8()
    autocast = backend.autocast_device_type is not None
    return tuple(
        name
        for name in HPU_PRECISIONS
        if (fp16 or name not in _FP16_PRECISIONS)
        and (fp8 or name != "fp8")
        and (autocast or not name.endswith("-mixed"))
    )


def check_precision_supported(precision: str | int | Precision, backend: hpu.Backend | None = None) -> None:
    """Raises a clear error for a precision the HPU (or its emulation) cannot run.

    Args:
        precision: a ``Trainer(precision=...)`` value (``"bf16-mixed"``, ``"64"``, ``16`` ...) or a precision plugin.
        backend: the HPU to check against; the current one when ``None``.

    Raises:
        ValueError: a precision outside :data:`HPU_PRECISIONS` (``64-true``, ``transformer-engine``, ...), fp16 or fp8
            on first-generation Gaudi, mixed precision under lazy emulation, or a mixed-precision plugin that autocasts
            on another device type than the HPU's.
    """
    backend = backend or hpu.get_backend()
    if isinstance(precision, Precision):
        name = str(precision.precision)
        given = f"{type(precision).__name__} (precision {name!r})"
        autocast = backend.autocast_device_type
        if isinstance(precision, MixedPrecision) and autocast is not None and precision.device != autocast:
            raise ValueError(
                f"{given} autocasts on {precision.device!r}, not on the HPU. Use `HPUPrecision({name!r})` or"
                f" `Trainer(precision={name!r})`."
            )
    else:
        name = _ALIASES.get(str(precision), str(precision))
        given = f"`precision={precision!r}`" + (f" ({name!r})" if name != precision else "")
    if name not in HPU_PRECISIONS:
        hint = next((text for prefix, text in _HINTS.items() if name.startswith(prefix)), "")
        works = ", ".join(repr(option) for option in supported_precisions(backend))
        raise ValueError(f"{given} cannot run on an HPU.{hint} Use one of {works}.")
    if name in _FP16_PRECISIONS and not backend.supports_fp16():
        raise ValueError(
            f"{given} needs float16, which first-generation Gaudi ({backend.device_name()}) does"
            " not have. Use `precision='bf16-mixed'` or 'bf16-true' (every Gaudi runs bfloat16)."
        )
    if name == "fp8" and not backend.supports_fp8():
        raise ValueError(
            f"{given} needs FP8 matrix units, which first-generation Gaudi ({backend.device_name()}) does not have"
            " (Gaudi 2 and later do). Use `precision='bf16-mixed'`."
        )
    if name.endswith("-mixed") and backend.autocast_device_type is None:
        raise ValueError(
            f"{given} needs torch.autocast, which the {backend.name!r} HPU backend does not have"
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
        # ids of optimizers that unscale in step(): unscaled here for clipping, or whose backward was skipped, since
        # their last step
        self._unscaled: set[int] = set()
        self._backward_skipped: set[int] = set()

    @override
    def optimizer_step(  # type: ignore[override]
        self,
        optimizer: Optimizable,
        model: pl.LightningModule,
        closure: Callable[[], Any],
        **kwargs: Any,
    ) -> Any:
        if self.scaler is None or not _unscales_in_step(optimizer):
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        key = id(optimizer)

        def closure_noting_a_skipped_backward() -> Any:
            result = closure()
            if result is None and model.automatic_optimization:
                self._backward_skipped.add(key)  # no scaler step follows, so nothing may be unscaled
            return result

        try:
            return super().optimizer_step(optimizer, model, closure_noting_a_skipped_backward, **kwargs)
        finally:
            self._unscaled.discard(key)
            self._backward_skipped.discard(key)

    @override
    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """Clips gradients, fused optimizers' included (Lightning refuses those under ``"16-mixed"``).

        Without a scaler (bf16) there is nothing to unscale. With one, an optimizer that unscales inside its own
        ``step()`` (a fused one) gets ``scaler.unscale_`` first, so clipping sees true gradients; ``scaler.step`` then
        hands it the inf check instead of the scale, and a step with inf or NaN gradients is still skipped.
        """
        if self.scaler is None:
            Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
            return
        if clip_val > 0 and _unscales_in_step(optimizer):
            key = id(optimizer)
            if key not in self._unscaled and key not in self._backward_skipped:
                self.scaler.unscale_(optimizer)
                self._unscaled.add(key)
            Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
            return
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)


def _unscales_in_step(optimizer: Any) -> bool:
    # imported here: the patches package imports this module (the connector patch builds HPUPrecision)
    from lightning_gaudi.patches import amp_unscaling

    return amp_unscaling.installed() and amp_unscaling.unscales_in_step(optimizer)
