"""The interface every HPU backend implements (the bridge, eager and lazy emulation); nothing here knows Lightning."""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.nn import functional as F
from torch.optim import Optimizer
from torch.profiler import ProfilerActivity

from lightning_gaudi.hpu.fp8 import NeuralCompressor, TransformerEngine
from lightning_gaudi.hpu.oom import is_bridge_out_of_memory

#: The keys of ``habana_frameworks.torch.hpu.memory_stats()``, which every backend returns.
MEMORY_STAT_KEYS = (
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
    "TotalSystemAllocs",
    "TotalSystemFrees",
    "TotalActiveAllocs",
)
#: The keys of :data:`MEMORY_STAT_KEYS` that are sizes in bytes; the others count allocations.
MEMORY_BYTE_KEYS = ("Limit", "InUse", "MaxInUse", "MaxAllocSize")

#: Device names the bridge reports, by Gaudi generation.
GAUDI_NAMES = ("GAUDI", "GAUDI2", "GAUDI3")
#: Each generation's on-card memory (HBM) in GiB, an emulated card's ``Limit``.
GAUDI_MEMORY_GIB = {"GAUDI": 32, "GAUDI2": 96, "GAUDI3": 128}
#: The largest E4M3 value each generation's FP8 units hold (``float8_e4m3fnuz``'s and ``float8_e4m3fn``'s range, as
#: Intel Neural Compressor 3.10 scales them).
FP8_E4M3_MAX = {"GAUDI2": 240.0, "GAUDI3": 448.0}


@dataclass
class LazyCounters:
    """Lazy-mode counters since the last reset (``None``: the backend cannot count them)."""

    graph_compilations: int = 0
    cpu_fallbacks: dict[str, int] = field(default_factory=dict)
    host_syncs: int | None = None
    mark_steps: int | None = None


class ClipNorm(abc.ABC):
    """Clips gradients in place by their global 2-norm, like ``hpex.normalization.FusedClipNorm``."""

    @abc.abstractmethod
    def clip_norm(self, parameters: Iterable[Tensor] | Tensor) -> Tensor:
        """Clips the gradients of ``parameters`` in place and returns their total norm before clipping."""


class Backend(abc.ABC):
    """What lightning_gaudi needs from an HPU; the defaults are a device's without lazy mode, graphs or collectives.

    Attributes:
        name, emulated: ``"habana"``, ``"eager"`` or ``"lazy"``; whether it runs on the CPU instead of a Gaudi.
        device_type, autocast_device_type: the ``torch.device`` and ``torch.autocast`` types (``None``: no autocast).
        collective_backend, compile_backend: the ``torch.distributed`` and ``torch.compile`` backends.
    """

    name: str
    emulated: bool
    device_type: str
    autocast_device_type: str | None
    collective_backend: str
    compile_backend: str

    #: Why this backend drives one device only (in its words, with the way out); ``None`` where collectives run.
    single_device_reason: str | None = None
    #: Whether evaluation may run under ``torch.inference_mode`` (else the loops use ``torch.no_grad``).
    supports_inference_mode: bool = True
    #: Whether the device applies ``PT_HPU_AUTOCAST_*_OPS_LIST`` itself (else :class:`~lightning_gaudi.HPUPrecision`).
    applies_autocast_lists: bool = True
    #: Whether :meth:`explain_error` has notes for errors raised inside a module's forward (Fabric then hooks it).
    explains_forward_errors: bool = False
    #: What the CPU fallbacks of :meth:`lazy_counters` are where they are a stand-in's own (``""``: the device's).
    fallbacks_note: str = ""
    #: What the start-up lines add after the collective backend's name (``""``: nothing to add).
    collective_note: str = ""
    #: How to see the device runtime's own log, for diagnostics (``""``: it has none).
    log_hint: str = ""
    #: Whether DeepSpeed should be Intel's Gaudi fork (else public DeepSpeed's CPU accelerator).
    wants_intel_deepspeed: bool = True

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether at least one device can be used."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """The number of devices on this node."""

    @abc.abstractmethod
    def device_name(self) -> str:
        """The device's name as the bridge reports it (``"GAUDI"``, ``"GAUDI2"``, ``"GAUDI3"``)."""

    def device_description(self) -> str:
        """The device as the start-up lines name it (and what runs it where that is not a Gaudi)."""
        return self.device_name()

    def check_compile_backend(self) -> str:
        """The ``torch.compile`` backend (:attr:`compile_backend`), after checking that it can run here."""
        return self.compile_backend

    def device(self, index: int | None = None) -> torch.device:
        """The ``torch.device`` of the card this process drives."""
        return torch.device(self.device_type)

    def is_lazy(self) -> bool:
        """Whether ops accumulate into graphs that run at :meth:`mark_step`."""
        return False

    def mark_step(self) -> None:
        """Cuts the accumulated graph and launches it (a no-op outside lazy mode)."""
        return None

    def synchronize(self) -> None:
        """Waits for all launched work to finish."""
        return None

    @abc.abstractmethod
    def memory_stats(self) -> dict[str, int]:
        """The values under the keys of :data:`MEMORY_STAT_KEYS`: bytes (:data:`MEMORY_BYTE_KEYS`) and counts."""

    def reset_peak_memory_stats(self) -> None:
        """Resets ``MaxInUse`` where the backend can."""
        return None

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether ``error`` says the device ran out of memory: torch's ``OutOfMemoryError`` or the bridge's
        ``RuntimeError`` (:func:`~lightning_gaudi.hpu.oom.is_bridge_out_of_memory`)."""
        return isinstance(error, torch.OutOfMemoryError) or is_bridge_out_of_memory(error)

    def init_distributed(self, world_size: int, rank: int, local_rank: int) -> None:
        """Prepares the collective backend; call before ``torch.distributed.init_process_group``."""
        return None

    def supports_fp16(self) -> bool:
        """Whether the device computes in float16 (Gaudi2 and later)."""
        return self.device_name() != "GAUDI"

    def supports_fp8(self) -> bool:
        """Whether the device computes matrix products in FP8 (Gaudi2 and later)."""
        return self.device_name() != "GAUDI"

    @abc.abstractmethod
    def int64_supported(self) -> bool:
        """Whether the device keeps int64 tensors in int64 (:func:`~lightning_gaudi.hpu.dtypes.int64_supported`)."""

    def device_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype whose values a ``dtype`` tensor holds on the device: float32 for float64, int32 for int64 without
        :meth:`int64_supported`, else ``dtype`` (:mod:`lightning_gaudi.hpu.dtypes`)."""
        if dtype == torch.float64:
            return torch.float32
        if dtype == torch.int64 and not self.int64_supported():
            return torch.int32
        return dtype

    #: Whether :meth:`copied_to_device` can change a tensor (an emulator's copy); callers skip it where it cannot.
    converts_copies: bool = False

    def copied_to_device(self, tensor: Tensor) -> Tensor:
        """``tensor`` (a host tensor about to move to the device) with the values the device will hold: unchanged where
        the copy converts by itself (the bridge), converted as the bridge does in an emulator (:meth:`device_dtype`)."""
        return tensor

    def fp8_e4m3_max(self) -> float | None:
        """The largest E4M3 magnitude the device's FP8 units hold (:data:`FP8_E4M3_MAX`), ``None`` without FP8."""
        return FP8_E4M3_MAX.get(self.device_name()) if self.supports_fp8() else None

    def transformer_engine(self) -> TransformerEngine | None:
        """Intel's FP8 modules, or ``None`` where FP8 is emulated (:mod:`lightning_gaudi.fp8`)."""
        return None

    def neural_compressor(self) -> NeuralCompressor | None:
        """Intel Neural Compressor's FP8 inference, or ``None`` where it is emulated (:mod:`lightning_gaudi.fp8`)."""
        return None

    @abc.abstractmethod
    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        """A fused AdamW over ``params`` with torch.optim.AdamW's keyword arguments."""

    @abc.abstractmethod
    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        """A fused SGD over ``params`` with torch.optim.SGD's keyword arguments."""

    @abc.abstractmethod
    def fused_clip_norm(self, parameters: Iterable[Tensor], max_norm: float) -> ClipNorm:
        """A gradient clipper by 2-norm bound to ``parameters``."""

    def sdpa(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        recompute: bool | None = None,
    ) -> Tensor:
        """``torch.nn.functional.scaled_dot_product_attention``; ``recompute`` picks FusedSDPA's mode (``None``: its
        default)."""
        kernel = self._sdpa_kernel()
        if kernel is None:  # torch's own, which takes ``scale`` by keyword only
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
        args = (query, key, value, attn_mask, dropout_p, is_causal, scale)
        out: Tensor = kernel(*args) if recompute is None else kernel(*args, "None", recompute)  # softmax_mode "None"
        return out

    def _sdpa_kernel(self) -> Any:
        """A fused kernel taking ``sdpa``'s arguments by position, or ``None`` for torch's."""
        return None

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm over the last dimension as Hugging Face's LLaMA computes it (normalized in float32)."""
        kernel = self._rms_norm_kernel()
        if kernel is not None:  # the kernel takes one dtype
            out: Tensor = kernel(x.to(weight.dtype), weight, eps)
            return out.to(torch.promote_types(x.dtype, weight.dtype))
        h = x.float()
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def _rms_norm_kernel(self) -> Any:
        """A fused kernel ``(x, weight, eps)``, or ``None`` for the reference math."""
        return None

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotary position embedding ``x * cos + rotate_half(x) * sin``, as Hugging Face's ``apply_rotary_pos_emb``."""
        kernel = self._rope_kernel()
        if kernel is not None:  # the kernel takes one dtype
            dtype = torch.promote_types(x.dtype, cos.dtype)
            return kernel(x.to(dtype), cos.to(dtype), sin.to(dtype), 0)
        half = x.shape[-1] // 2
        return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)

    def _rope_kernel(self) -> Any:
        """A fused kernel ``(x, cos, sin, offset)``, or ``None`` for the reference math."""
        return None

    def convert_sync_batchnorm(self, module: Module) -> Module:
        """``module`` with every batch norm synchronized over the ranks (``torch.nn.SyncBatchNorm``)."""
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)

    def revert_sync_batchnorm(self, module: Module) -> Module:
        """Undoes what :meth:`convert_sync_batchnorm` built besides ``torch.nn.SyncBatchNorm``."""
        return module

    def wrap_in_hpu_graph(self, module: Module) -> Module:
        """Wraps ``module`` so its forward is captured once and replayed (lazy mode, inference)."""
        return module

    def lazy_counters(self) -> LazyCounters | None:
        """Lazy-mode counters since the last :meth:`reset_lazy_counters`, or ``None`` outside lazy mode."""
        return None

    def reset_lazy_counters(self) -> None:
        """Zeroes the lazy-mode counters."""
        return None

    def explain_error(self, error: BaseException) -> bool:
        """Rewrites ``error``'s message in place when it is a known limit of this backend; returns whether it did."""
        return False

    def profiler_activities(self) -> list[ProfilerActivity]:
        """The ``torch.profiler`` activities that record this device's work."""
        return [ProfilerActivity.CPU]
