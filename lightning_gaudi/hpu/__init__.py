"""The one seam to whatever provides the HPU (:func:`get_backend`: eager or lazy emulation, or Intel's bridge); every
``habana_frameworks`` and ``torch._lazy`` call goes through it."""

from __future__ import annotations

import os

import torch

from lightning_gaudi.hpu import hccl, runtime
from lightning_gaudi.hpu.backend import GAUDI_NAMES, MEMORY_STAT_KEYS, Backend, ClipNorm, LazyCounters
from lightning_gaudi.hpu.runtime import (
    DEVICE_NAME_ENV,
    DEVICES_ENV,
    EMULATE_ENV,
    EMULATION_MODES,
    VISIBLE_MODULES_ENV,
    RecipeCache,
    Runtime,
    bridge_installed,
    bridge_loaded,
    configure,
    emulation_mode,
)

__all__ = [
    "DEVICES_ENV",
    "DEVICE_NAME_ENV",
    "EMULATE_ENV",
    "EMULATION_MODES",
    "GAUDI_NAMES",
    "MEMORY_STAT_KEYS",
    "VISIBLE_MODULES_ENV",
    "Backend",
    "ClipNorm",
    "HPUUnavailableError",
    "LazyCounters",
    "RecipeCache",
    "Runtime",
    "bridge_installed",
    "bridge_loaded",
    "configure",
    "device_summary",
    "emulation_mode",
    "explain_error",
    "get_backend",
    "is_available",
]


NO_HPU_MESSAGE = (
    "No Gaudi HPU is usable: Intel's PyTorch bridge (`habana_frameworks.torch`) is not installed. On a Gaudi, install"
    " Intel Gaudi software (https://docs.habana.ai/en/latest/Installation_Guide/); to run the HPU code paths on the"
    f" CPU, set {EMULATE_ENV}=eager (or =lazy to emulate lazy mode)."
)


class HPUUnavailableError(RuntimeError):
    """Raised when an HPU is needed and neither Intel's bridge nor emulation provides one."""


_backends: dict[tuple[str, int, str], Backend] = {}


def device_summary(used_devices: int, strategy: str | None = None, num_nodes: int = 1) -> str:
    """The start-of-run line: a Gaudi or the emulator (and why), the mode, the cards used per node, the strategy."""
    backend = get_backend()
    try:
        compiled = runtime.Runtime.from_env().execution_mode == "compile"
    except ValueError:
        compiled = False
    mode = "compile" if compiled else ("lazy" if backend.is_lazy() else "eager")
    name = backend.device_name()
    what = f"{name}, {mode} mode"
    if backend.emulated:
        threads = torch.get_num_threads()
        what = f"{name}, EMULATED on the CPU in {mode} mode, {threads} torch thread{'' if threads == 1 else 's'}"
    line = f"HPU available: True ({what}), using: {used_devices} HPU{'' if used_devices == 1 else 's'}"
    if num_nodes > 1:
        line += f" on each of {num_nodes} nodes"
    if strategy:
        line += f", strategy {strategy}"
    if backend.emulated:
        why = "; Intel's bridge is not installed" if not runtime.bridge_installed() else ""
        line += f". Emulation ({EMULATE_ENV}={backend.name}{why}): numbers from this run are CPU numbers."
    return line


def explain_error(error: BaseException) -> bool:
    """HCCL's way out of its reduce-op error (:func:`.hccl.explain`), then :meth:`Backend.explain_error` of every
    backend in use; returns whether one rewrote ``error``. Never raises."""
    explained = hccl.explain(error)
    return any(backend.explain_error(error) for backend in list(_backends.values())) or explained


def get_backend() -> Backend:
    """The backend for this process's settings (one per setting); :class:`HPUUnavailableError` without one."""
    mode = emulation_mode()
    lazy = runtime.lazy_mode()  # a value the bridge breaks on is refused in emulation too
    key = (
        ("habana", 0, "")
        if mode is None
        else (mode, runtime.visible_emulated_devices(), runtime.emulated_device_name())
    )
    backend = _backends.get(key)
    if backend is not None:
        return backend
    if mode is None:
        if not runtime.bridge_installed():
            raise HPUUnavailableError(NO_HPU_MESSAGE)
        # lazy mode on a build without it is refused before the bridge loads (it would stop on an assertion)
        if lazy and not runtime.bridge_loaded() and (why := runtime.lazy_mode_unavailable()):
            raise ValueError(f"{runtime.LAZY_MODE_ENV}=1 asks for lazy mode, but {why}. {runtime.NO_LAZY_FIX}.")
        if not runtime.bridge_loaded() and (recipes := runtime.default_recipe_cache()) is not None:
            os.environ[runtime.RECIPE_CACHE_ENV] = recipes.env_value()  # the compile cache policy's, read at load
        from lightning_gaudi.hpu.bridge import HabanaBackend

        backend = HabanaBackend()
    elif mode == "eager":
        from lightning_gaudi.emulator.eager import EagerBackend

        backend = EagerBackend(key[1], key[2])
    else:
        from lightning_gaudi.emulator.lazy import LazyBackend

        backend = LazyBackend(key[2])
    _backends[key] = backend
    return backend


def is_available() -> bool:
    """Whether an HPU (real or emulated) can be used. A malformed emulation setting still raises."""
    try:
        backend = get_backend()
    except HPUUnavailableError:
        return False
    return backend.is_available()
