"""Eager emulation: the HPU code paths on CPU tensors, gloo collectives and CPU bf16 autocast.

Memory statistics are what the host can honestly measure: ``InUse`` is this process's resident set,
``MaxInUse`` its peak resident set (``getrusage``), ``Limit`` the machine's physical memory. The allocation
counters a Gaudi reports have no CPU equivalent and read 0.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.nn import functional as F
from torch.optim import Optimizer

from lightning_gaudi.hpu.backend import MEMORY_STAT_KEYS, Backend, ClipNorm, LazyCounters


class TorchClipNorm(ClipNorm):
    """``FusedClipNorm``'s contract on torch's ``clip_grad_norm_`` (multi-tensor kernels unless ``foreach=False``)."""

    def __init__(self, max_norm: float, foreach: bool = True) -> None:
        self.max_norm = float(max_norm)
        self.foreach = foreach

    def clip_norm(self, parameters: Iterable[Tensor] | Tensor) -> Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, norm_type=2.0, foreach=self.foreach)


def host_memory_stats() -> dict[str, int]:
    """This process's memory in the bridge's ``memory_stats`` form (see the module docstring)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    stats = dict.fromkeys(MEMORY_STAT_KEYS, 0)
    stats.update(Limit=os.sysconf("SC_PHYS_PAGES") * page, InUse=rss, MaxInUse=max(peak, rss))
    return stats


class EagerBackend(Backend):
    """HPU emulation on CPU tensors (``LIGHTNING_GAUDI_EMULATE=eager``).

    Args:
        devices: how many emulated cards one node has.
        device_name: the Gaudi generation to emulate (decides fp16 support).
    """

    name = "eager"
    emulated = True
    device_type = "cpu"
    autocast_device_type: str | None = "cpu"
    collective_backend = "gloo"
    compile_backend = "aot_eager"

    def __init__(self, devices: int, device_name: str) -> None:
        self._devices = devices
        self._device_name = device_name

    def is_available(self) -> bool:
        return self._devices > 0

    def device_count(self) -> int:
        return self._devices

    def device_name(self) -> str:
        return self._device_name

    def device(self, index: int | None = None) -> torch.device:
        return torch.device(self.device_type)

    def is_lazy(self) -> bool:
        return False

    def mark_step(self) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def memory_stats(self) -> dict[str, int]:
        return host_memory_stats()

    def reset_peak_memory_stats(self) -> None:
        return None  # the kernel's peak resident set cannot be reset

    def init_distributed(self, world_size: int, rank: int, local_rank: int) -> None:
        return None  # gloo needs nothing beyond init_process_group

    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        return torch.optim.AdamW(params, fused=True, **kwargs)

    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        return torch.optim.SGD(params, fused=True, **kwargs)

    def fused_clip_norm(self, parameters: Iterable[Tensor], max_norm: float) -> ClipNorm:
        return TorchClipNorm(max_norm)

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
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )

    def wrap_in_hpu_graph(self, module: Module) -> Module:
        return module  # there is no graph to capture in eager mode

    def lazy_counters(self) -> LazyCounters | None:
        return None

    def reset_lazy_counters(self) -> None:
        return None
