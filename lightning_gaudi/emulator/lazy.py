"""Lazy emulation: torch's Lazy Tensor Core (TorchScript backend) on the CPU, one device, without autocast, fused
optimizers or collectives (:data:`LIMIT_NOTE`)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_gaudi.emulator.eager import EagerBackend, TorchClipNorm
from lightning_gaudi.hpu.backend import ClipNorm, LazyCounters
from lightning_gaudi.hpu.runtime import EMULATE_ENV

_FALLBACK_PREFIX = "aten::"
_HOST_SYNC_COUNTER = "aten::_local_scalar_dense"
_ts_backend_ready = False
#: Words that only torch's Lazy Tensor Core puts in its errors (CPU pieces in forward, in backward, internal asserts).
_LTC_ERROR_MARKS = ("is not a lazy tensor", "expected device lazy", "torch/csrc/lazy/")
LIMIT_NOTE = (
    "lightning_gaudi: this is a limit of lazy emulation (LIGHTNING_GAUDI_EMULATE=lazy, torch's Lazy Tensor Core), not"
    " a bug in the model and not a limit of Gaudi's lazy mode, which is another implementation. Lazy Tensor Core hands"
    " back CPU tensors for the pieces of split/chunk/unbind (as in nn.MultiheadAttention with its own keys and values"
    " or Hugging Face GPT-2's fused QKV projection), and some of its internal checks fail (Hugging Face's KV cache)."
    " Run this model in eager emulation, LIGHTNING_GAUDI_EMULATE=eager, or in compile mode on it, adding"
    " LIGHTNING_GAUDI_COMPILE=1 (lightning_gaudi.configure(execution_mode='eager' or 'compile'); in the Hydra app"
    " runtime.execution_mode=eager or compile)."
)


class LazyBackend(EagerBackend):
    """HPU lazy-mode emulation on torch's Lazy Tensor Core (``LIGHTNING_GAUDI_EMULATE=lazy``), one ``device_name``."""

    name = "lazy"
    device_type = "lazy"
    autocast_device_type = None
    compile_backend = "aot_eager"
    single_device_reason = (
        "Lazy emulation drives one HPU: torch's Lazy Tensor Core tensors cannot cross gloo collectives. Emulate"
        f" several HPUs with {EMULATE_ENV}=eager"
    )
    supports_inference_mode = False  # Lazy Tensor Core cannot trace inference_mode: evaluation runs under no_grad
    explains_forward_errors = True
    fallbacks_note = (
        "emulator artefacts: torch's Lazy Tensor Core runs these on the CPU; Gaudi runs lerp, mse_loss,"
        " linalg_vector_norm on the device"
    )

    def __init__(self, device_name: str) -> None:
        super().__init__(1, device_name)  # the honest capacity: gloo cannot carry lazy tensors to a second device
        import torch._lazy
        import torch._lazy.metrics
        import torch._lazy.ts_backend

        global _ts_backend_ready
        if not _ts_backend_ready:  # registering the TorchScript backend twice in one process raises
            torch._lazy.ts_backend.init()
            _ts_backend_ready = True
        self._lazy = torch._lazy
        self._metrics = torch._lazy.metrics
        self._warned_unfused = False

    def is_lazy(self) -> bool:
        return True

    def mark_step(self) -> None:
        self._lazy.mark_step()

    def synchronize(self) -> None:
        self._lazy.wait_device_ops()

    def _unfused(self, cls: type[Optimizer], params: Any, kwargs: dict[str, Any]) -> Optimizer:
        if not self._warned_unfused:
            self._warned_unfused = True
            warnings.warn(
                "Lazy emulation has no fused optimizer kernels: using torch's single-tensor"
                f" {cls.__name__} (same numerics, no fusion).",
                stacklevel=3,
            )
        return cls(params, foreach=False, **kwargs)  # type: ignore[call-arg]

    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._unfused(torch.optim.AdamW, params, kwargs)

    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._unfused(torch.optim.SGD, params, kwargs)

    def fused_clip_norm(self, parameters: Iterable[Tensor], max_norm: float) -> ClipNorm:
        return TorchClipNorm(max_norm, foreach=False)

    def lazy_counters(self) -> LazyCounters:
        m = self._metrics
        names = m.counter_names()
        fallbacks = {
            n[len(_FALLBACK_PREFIX) :]: m.counter_value(n)
            for n in names
            if n.startswith(_FALLBACK_PREFIX) and n != _HOST_SYNC_COUNTER
        }
        return LazyCounters(
            graph_compilations=m.counter_value("UncachedCompile") or 0,
            cpu_fallbacks=fallbacks,
            host_syncs=m.counter_value(_HOST_SYNC_COUNTER) or 0,
            mark_steps=m.counter_value("MarkStep") or 0,
        )

    def reset_lazy_counters(self) -> None:
        self._metrics.reset()

    def explain_error(self, error: BaseException) -> bool:
        if super().explain_error(error):  # the host ran out
            return True
        if not isinstance(error, RuntimeError) or len(error.args) != 1 or not isinstance(error.args[0], str):
            return False
        message = error.args[0]
        if LIMIT_NOTE in message or not any(mark in message for mark in _LTC_ERROR_MARKS):
            return False
        error.args = (f"{message}\n\n{LIMIT_NOTE}",)
        return True
