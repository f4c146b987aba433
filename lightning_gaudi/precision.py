"""Mixed precision on the HPU's own autocast device type."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from contextlib import contextmanager, nullcontext
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import Optimizable
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import LBFGS, Optimizer
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.optimizers import fused_clip_grad_norm

_Precision = Literal["bf16-mixed", "16-mixed"]
_FP16_PRECISIONS = ("16-mixed", "16-true")
#: Every precision lightning_gaudi trains in, in the order errors list them.
HPU_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "fp8")
#: Lightning's short precision names, as its Trainer reads them.
_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
_HINTS = {
    "64": " A Gaudi holds float64 tensors in float32, so the model would train in single precision.",
    "transformer-engine": " Lightning's transformer-engine precision is NVIDIA's; on Gaudi 2 and later use"
    " `precision='fp8'`.",
}


def supported_precisions(backend: hpu.Backend | None = None) -> tuple[str, ...]:
    """The precisions this HPU runs: :data:`HPU_PRECISIONS` less those the device lacks."""
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
    """Raises ``ValueError`` for a precision (``Trainer(precision=...)`` or a plugin) that ``backend`` cannot run."""
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
            f"{given} needs float16, which first-generation Gaudi ({backend.device_name()}) does not have. Use"
            " `precision='bf16-mixed'` or 'bf16-true' (every Gaudi runs bfloat16)."
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


class OpListMode(TorchFunctionMode):
    """Inside autocast, runs the ops named in ``bf16_ops`` / ``fp32_ops`` with autocast off on inputs cast to that
    dtype (the emulation of Gaudi's autocast list files); other ops follow the device's autocast policy."""

    def __init__(self, device_type: str, bf16_ops: Iterable[str], fp32_ops: Iterable[str]) -> None:
        super().__init__()
        self.device_type = device_type
        self.dtypes = {name: torch.bfloat16 for name in bf16_ops} | {name: torch.float32 for name in fp32_ops}

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        dtype = self.dtypes.get(getattr(func, "__name__", "").strip("_"))
        if dtype is None or not torch.is_autocast_enabled(self.device_type):
            return func(*args, **kwargs)

        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
                return value.to(dtype)
            return value

        with torch.autocast(self.device_type, enabled=False):
            return func(*tree_map(cast, args), **tree_map(cast, kwargs))


def autocast_device(precision: str, api: str) -> str:
    """The device type mixed ``precision`` autocasts on here; ``ValueError`` for a precision it cannot run."""
    if precision not in ("bf16-mixed", "16-mixed"):
        raise ValueError(
            f"HPUPrecision got `precision={precision!r}`; it handles 'bf16-mixed' and '16-mixed'. For"
            f" '32-true' or 'bf16-true' pass the string to `{api}(precision=...)`."
        )
    backend = hpu.get_backend()
    check_precision_supported(precision, backend)
    assert backend.autocast_device_type is not None  # checked: mixed precision needs autocast
    return backend.autocast_device_type


class HPUPrecision(MixedPrecision):
    """Automatic mixed precision with ``torch.autocast`` on the HPU device type; fused optimizers are clipped with the
    fused clipper.

    Args:
        precision: ``"bf16-mixed"`` (every Gaudi) or ``"16-mixed"`` (Gaudi2 and later, with a gradient scaler).
        scaler: a ``torch.amp.GradScaler`` for ``"16-mixed"``; one is made when not given.

    Attributes:
        op_lists: an :class:`OpListMode` entered with autocast (emulation: set by ``BF16Autocast``).
    """

    def __init__(self, precision: _Precision = "bf16-mixed", scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__(precision, device=autocast_device(precision, "Trainer"), scaler=scaler)
        self.op_lists: OpListMode | None = None

    @override
    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with super().forward_context(), nullcontext() if self.op_lists is None else self.op_lists:
            yield

    @override
    def optimizer_step(  # type: ignore[override]
        self, optimizer: Optimizable, model: pl.LightningModule, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise ValueError("precision='16-mixed' cannot drive LBFGS (AMP); use 'bf16-mixed' or '32-true'.")
        result = closure()
        stepped = result is not None or not model.automatic_optimization  # else Lightning skipped the backward
        if stepped:
            self.scaler.unscale_(optimizer)  # type: ignore[arg-type]
        self._after_closure(model, optimizer)  # on_before_optimizer_step, then clipping
        if not stepped:
            return result
        output = self.scaler.step(optimizer, **kwargs)  # type: ignore[arg-type]  # skipped on inf or NaN
        self.scaler.update()
        return output

    @override
    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        # gradients are unscaled (optimizer_step), so fused optimizers may be clipped too
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: int | float) -> None:
        if not fused_clip_grad_norm(optimizer, clip_val):
            super().clip_grad_by_norm(optimizer, clip_val)
