"""Eager emulation: the HPU code paths on CPU tensors, gloo collectives behind HCCL's rules (``"hccl"``) and CPU bf16
autocast; memory statistics are the host process's against the emulated card's HBM; host tensors moved to the device
take the values a Gaudi holds (:mod:`lightning_gaudi.hpu.dtypes`)."""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from lightning_gaudi.emulator import sync_batchnorm
from lightning_gaudi.emulator.hccl_group import register_emulated_hccl
from lightning_gaudi.hpu.backend import GAUDI_MEMORY_GIB, MEMORY_STAT_KEYS, Backend, ClipNorm
from lightning_gaudi.hpu.dtypes import held_values, int64_supported, range_check_enabled
from lightning_gaudi.hpu.oom import allocation_failed_message, is_bridge_out_of_memory
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV, emulated_compile_backend

#: torch threads per emulator process unless the user chose a count (a thread per core ran 2.8 to 3.9 times slower
#: on 2 shared cores).
EMULATED_THREADS = 1
#: The variables by which a user sets torch's thread count before it starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would build CPU kernels with, or ``None`` when it finds none."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return str(get_cpp_compiler())
    except Exception:  # inductor raises its own InvalidCxxCompiler, or a subprocess/import error, when none is usable
        return None


def physical_cores(cpuinfo: str) -> int | None:
    """The physical cores in ``/proc/cpuinfo`` text, or ``None`` when it lists no core ids."""
    cores = set()
    for block in cpuinfo.split("\n\n"):
        fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}
        if "core id" in fields:
            cores.add((fields.get("physical id"), fields["core id"]))
    return len(cores) or None


def torch_default_threads() -> int:
    """torch's default thread count: the physical cores, else the logical CPUs."""
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


#: What torch's CPU allocator says when the host has no memory left, and the size it refused.
_HOST_OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory(?:: you tried to allocate (\d+) bytes)?")


class TorchClipNorm(ClipNorm):
    """``FusedClipNorm``'s contract on torch's ``clip_grad_norm_`` (multi-tensor kernels unless ``foreach=False``)."""

    def __init__(self, max_norm: float, foreach: bool = True) -> None:
        self.max_norm = float(max_norm)
        self.foreach = foreach

    def clip_norm(self, parameters: Iterable[Tensor] | Tensor) -> Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, norm_type=2.0, foreach=self.foreach)


def host_memory_stats(limit: int | None = None) -> dict[str, int]:
    """This process's memory in the bridge's ``memory_stats`` form, against ``limit`` bytes (default: the host's)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    stats = dict.fromkeys(MEMORY_STAT_KEYS, 0)
    total = os.sysconf("SC_PHYS_PAGES") * page if limit is None else limit
    stats.update(Limit=total, InUse=rss, MaxInUse=max(peak, rss))
    return stats


class EagerBackend(Backend):
    """HPU emulation on CPU tensors (``LIGHTNING_GAUDI_EMULATE=eager``): ``devices`` cards of ``device_name``
    (those ``HABANA_VISIBLE_MODULES`` lets this process see, as on a Gaudi)."""

    name = "eager"
    emulated = True
    device_type = "cpu"
    autocast_device_type: str | None = "cpu"
    collective_backend = "hccl"  # gloo behind HCCL's rules (:mod:`lightning_gaudi.emulator.hccl_group`)
    applies_autocast_lists = False
    collective_note = ", HCCL emulated over gloo"
    wants_intel_deepspeed = False

    def __init__(self, devices: int, device_name: str) -> None:
        self._devices = devices
        self._device_name = device_name
        _apply_thread_policy()
        register_emulated_hccl()

    @property
    def compile_backend(self) -> str:  # type: ignore[override]  # read from the environment at each use
        """:func:`~.runtime.emulated_compile_backend`, read at each use."""
        return emulated_compile_backend()

    def device_description(self) -> str:
        return f"{self.device_name()} emulated on the CPU ({self.name} mode)"

    def check_compile_backend(self) -> str:
        name = self.compile_backend
        known = torch.compiler.list_backends(exclude_tags=())
        if name not in known:
            raise ValueError(
                f"{COMPILE_BACKEND_ENV}={name!r} is not a torch.compile backend; use one of {known}"
                " ('inductor', the default, compiles for real; 'aot_eager' traces the same graphs without generating"
                " code)."
            )
        if name == "inductor" and cpp_compiler() is None:
            raise RuntimeError(
                "torch.compile's inductor backend (the default under eager emulation) needs a C++ compiler, and none"
                " was found. Install one (e.g. `apt-get install g++`, or point the CXX variable at one before"
                f" starting Python), or set {COMPILE_BACKEND_ENV}=aot_eager to trace the same graphs without"
                " generating code."
            )
        return name

    def convert_sync_batchnorm(self, module: Module) -> Module:
        return sync_batchnorm.convert(module)  # torch refuses SyncBatchNorm on CPU tensors

    def revert_sync_batchnorm(self, module: Module) -> Module:
        return sync_batchnorm.revert(module)

    def is_available(self) -> bool:
        return self._devices > 0

    def device_count(self) -> int:
        return self._devices

    def device_name(self) -> str:
        return self._device_name

    def memory_stats(self) -> dict[str, int]:
        return host_memory_stats(GAUDI_MEMORY_GIB[self._device_name] * 2**30)

    def is_out_of_memory(self, error: BaseException) -> bool:
        # torch's error and the bridge's wording (a model or test may raise it), or, the emulated card's memory being
        # the host's, its allocator's refusal
        return super().is_out_of_memory(error) or (
            isinstance(error, RuntimeError) and _HOST_OUT_OF_MEMORY.search(str(error)) is not None
        )

    def explain_error(self, error: BaseException) -> bool:
        """Words the host allocator's refusal as the bridge words a card that ran out (the PT_DEVMEM line of
        :func:`~lightning_gaudi.hpu.oom.allocation_failed_message`), after the host's own message and saying which it
        is. The emulator holds tensors in host memory and cannot refuse an allocation the host would grant, so an
        emulated card never runs out by itself before the host does."""
        if not isinstance(error, RuntimeError) or len(error.args) != 1 or not isinstance(error.args[0], str):
            return False
        message = error.args[0]
        found = _HOST_OUT_OF_MEMORY.search(message)
        if found is None or found.group(1) is None or is_bridge_out_of_memory(error):
            return False
        nbytes, name = int(found.group(1)), self._device_name
        card = GAUDI_MEMORY_GIB[name]
        if nbytes > card * 2**30:
            fits = f"more than a {name}'s {card} GiB, so a Gaudi runs out too"
        else:
            fits = f"within a {name}'s {card} GiB: the host has less free memory than the card"
        error.args = (
            f"{message}\n\nlightning_gaudi: the emulated {name}'s memory is this host's, whose allocator refused"
            f" {nbytes} bytes ({fits}); a Gaudi that runs out says {allocation_failed_message(nbytes)}",
        )
        return True

    def int64_supported(self) -> bool:
        return int64_supported(self.is_lazy(), self._device_name)

    converts_copies = True

    def copied_to_device(self, tensor: Tensor) -> Tensor:
        """A host tensor with the values a Gaudi holds of it (:func:`~lightning_gaudi.hpu.dtypes.held_values`):
        float64 in float32, int64 in int32 without int64 support, refused out of range in lazy mode."""
        held = self.device_dtype(tensor.dtype)
        if held == tensor.dtype or tensor.device.type != "cpu":
            return tensor
        return held_values(tensor, held, check_range=self.is_lazy() and range_check_enabled())

    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        return torch.optim.AdamW(params, fused=True, **kwargs)

    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        return torch.optim.SGD(params, fused=True, **kwargs)

    def fused_clip_norm(self, parameters: Iterable[Tensor], max_norm: float) -> ClipNorm:
        return TorchClipNorm(max_norm)
