"""The interface every HPU backend implements: the real bridge, eager emulation and lazy emulation.

Nothing in this sub-package knows about Lightning. Callers above it ask the backend, never
``habana_frameworks`` or ``torch._lazy`` directly.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from torch.profiler import ProfilerActivity

from lightning_gaudi.hpu.fp8 import TransformerEngine

#: The keys of ``habana_frameworks.torch.hpu.memory_stats()``, which every backend returns: sizes in bytes
#: (:data:`MEMORY_BYTE_KEYS`) and allocation counters.
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


@dataclass
class LazyCounters:
    """Cumulative lazy-mode counters since the last reset.

    Attributes:
        graph_compilations: graphs compiled (a new graph or a new shape).
        cpu_fallbacks: ops that ran on the host instead of the device, by op name.
        host_syncs: device-to-host reads (``.item()``, ``bool(tensor)``); ``None`` where the backend cannot count them.
        mark_steps: graph cuts (``mark_step`` calls); ``None`` where the backend cannot count them.
    """

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
    """What lightning_gaudi needs from an HPU, whatever provides it.

    Attributes:
        name: ``"habana"``, ``"eager"`` or ``"lazy"``.
        emulated: whether this runs on the CPU instead of a Gaudi.
        device_type: the ``torch.device`` type tensors live on.
        autocast_device_type: the ``torch.autocast`` device type, or ``None`` where autocast is unavailable.
        collective_backend: the ``torch.distributed`` backend for this device.
        compile_backend: the ``torch.compile`` backend for eager-mode graphs.
    """

    name: str
    emulated: bool
    device_type: str
    autocast_device_type: str | None
    collective_backend: str
    compile_backend: str

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether at least one device can be used."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """The number of devices on this node."""

    @abc.abstractmethod
    def device_name(self) -> str:
        """The device's name as the bridge reports it (``"GAUDI"``, ``"GAUDI2"``, ``"GAUDI3"``)."""

    @abc.abstractmethod
    def device(self, index: int | None = None) -> torch.device:
        """The ``torch.device`` of the card this process drives."""

    @abc.abstractmethod
    def is_lazy(self) -> bool:
        """Whether ops accumulate into graphs that run at :meth:`mark_step`."""

    @abc.abstractmethod
    def mark_step(self) -> None:
        """Cuts the accumulated graph and launches it (a no-op outside lazy mode)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Waits for all launched work to finish."""

    @abc.abstractmethod
    def memory_stats(self) -> dict[str, int]:
        """The values under the keys of :data:`MEMORY_STAT_KEYS`: bytes (:data:`MEMORY_BYTE_KEYS`) and counts."""

    @abc.abstractmethod
    def reset_peak_memory_stats(self) -> None:
        """Resets ``MaxInUse`` where the backend can."""

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether ``error`` says this device ran out of memory (what a batch-size search backs off on).

        Every backend recognises torch's ``torch.OutOfMemoryError``; each adds its device's own wording.
        """
        return isinstance(error, torch.OutOfMemoryError)

    @abc.abstractmethod
    def init_distributed(self, world_size: int, rank: int, local_rank: int) -> None:
        """Prepares the collective backend; call before ``torch.distributed.init_process_group``."""

    def supports_fp16(self) -> bool:
        """Whether the device computes in float16 (Gaudi2 and later)."""
        return self.device_name() != "GAUDI"

    def supports_fp8(self) -> bool:
        """Whether the device computes matrix products in FP8 (Gaudi2 and later)."""
        return self.device_name() != "GAUDI"

    def transformer_engine(self) -> TransformerEngine | None:
        """Intel's FP8 modules (:class:`~lightning_gaudi.hpu.fp8.TransformerEngine`), or ``None`` where the backend
        has none and FP8 is emulated (:mod:`lightning_gaudi.fp8`)."""
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

    @abc.abstractmethod
    def sdpa(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Tensor:
        """Scaled dot-product attention with the contract of ``torch.nn.functional.scaled_dot_product_attention``."""

    @abc.abstractmethod
    def wrap_in_hpu_graph(self, module: Module) -> Module:
        """Wraps ``module`` so its forward is captured once and replayed (lazy mode, inference)."""

    @abc.abstractmethod
    def lazy_counters(self) -> LazyCounters | None:
        """Lazy-mode counters since the last :meth:`reset_lazy_counters`, or ``None`` outside lazy mode."""

    @abc.abstractmethod
    def reset_lazy_counters(self) -> None:
        """Zeroes the lazy-mode counters."""

    def explain_error(self, error: BaseException) -> bool:
        """Rewrites ``error``'s message in place when it comes from a known limit of this backend rather than from
        the user's code, naming the limit and the way out; returns whether it did.

        Meant for ``Strategy.on_exception``: Lightning re-raises the same exception object afterwards (its
        ``DDPStrategy`` explains unused parameters the same way). Only runs when something has failed.
        """
        return False

    def profiler_activities(self) -> list[ProfilerActivity]:
        """The ``torch.profiler`` activities that record this device's work (the host's alone under emulation)."""
        return [ProfilerActivity.CPU]
