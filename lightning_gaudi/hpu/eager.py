"""Eager emulation: the HPU code paths on CPU tensors, gloo collectives and CPU bf16 autocast.

Memory statistics are what the host can honestly measure: ``InUse`` is this process's resident set,
``MaxInUse`` its peak resident set (``getrusage``), ``Limit`` the machine's physical memory. The allocation
counters a Gaudi reports have no CPU equivalent and read 0.

Threads: a process stands for one card, so an emulator (eager or lazy) sets torch to :data:`EMULATED_THREADS` thread
when it is created, unless the user chose a count: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set, or
``torch.set_num_threads`` called before (torch's count differs from its default, the physical cores). On a machine
shared with other work torch's default makes its threads wait on each other: the README's job ran 2.8 to 3.9 times
slower with a thread per core on 2 shared cores (``benchmarks/threads.py``). DDP ranks then get their share of the
cores from Lightning.
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
from lightning_gaudi.hpu.runtime import emulated_compile_backend

#: torch threads per emulator process when the user has not chosen a count (see the module docstring).
EMULATED_THREADS = 1
#: The variables by which a user sets torch's thread count before it starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def physical_cores(cpuinfo: str) -> int | None:
    """The physical cores listed in ``/proc/cpuinfo`` text (distinct physical id and core id); ``None`` when the
    text has no core ids."""
    cores = set()
    for block in cpuinfo.split("\n\n"):
        fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}
        if "core id" in fields:
            cores.add((fields.get("physical id"), fields["core id"]))
    return len(cores) or None


def torch_default_threads() -> int:
    """The thread count torch starts with when no variable sets it: the physical cores (as cpuinfo counts them),
    else the logical CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            cores = physical_cores(f.read())
    except OSError:
        cores = None
    return cores or os.cpu_count() or 1


def _apply_thread_policy() -> None:
    if any(os.environ.get(name) for name in THREAD_VARIABLES):
        return
    if torch.get_num_threads() == torch_default_threads():
        torch.set_num_threads(EMULATED_THREADS)


#: What torch's CPU allocator says when the host has no memory left.
_HOST_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"


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

    def __init__(self, devices: int, device_name: str) -> None:
        self._devices = devices
        self._device_name = device_name
        _apply_thread_policy()

    @property
    def compile_backend(self) -> str:  # type: ignore[override]  # read from the environment at each use
        """``LIGHTNING_GAUDI_COMPILE_BACKEND``, else ``inductor`` (see :func:`~.runtime.emulated_compile_backend`)."""
        return emulated_compile_backend()

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

    def is_out_of_memory(self, error: BaseException) -> bool:
        # the emulated card's memory is the host's: its allocator's refusal
        return super().is_out_of_memory(error) or (
            isinstance(error, RuntimeError) and _HOST_OUT_OF_MEMORY in str(error)
        )

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
