"""The one seam between lightning_gaudi and whatever provides the HPU.

Every ``habana_frameworks`` and ``torch._lazy`` call in the package goes through :func:`get_backend`, which picks:

- ``LIGHTNING_GAUDI_EMULATE=eager``: :class:`~lightning_gaudi.hpu.eager.EagerBackend` (CPU tensors, gloo);
- ``LIGHTNING_GAUDI_EMULATE=lazy``: :class:`~lightning_gaudi.hpu.lazy.LazyBackend` (torch's Lazy Tensor Core);
- otherwise, when Intel's bridge is installed: :class:`~lightning_gaudi.hpu.bridge.HabanaBackend`.

The settings (emulation, emulated cards and generation, execution mode, the bridge's own variables) are one typed
value, :class:`~lightning_gaudi.hpu.runtime.Runtime`, applied by :func:`~lightning_gaudi.hpu.runtime.configure`
before the bridge loads. Lazy emulation always has one device (see :mod:`~lightning_gaudi.hpu.lazy`).
"""

from __future__ import annotations

import logging

from lightning_gaudi.hpu import runtime
from lightning_gaudi.hpu.backend import GAUDI_NAMES, MEMORY_STAT_KEYS, Backend, ClipNorm, LazyCounters
from lightning_gaudi.hpu.runtime import (
    DEVICE_NAME_ENV,
    DEVICES_ENV,
    EMULATE_ENV,
    EMULATION_MODES,
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
    "Backend",
    "ClipNorm",
    "HPUUnavailableError",
    "LazyCounters",
    "RecipeCache",
    "Runtime",
    "bridge_installed",
    "bridge_loaded",
    "configure",
    "emulation_mode",
    "get_backend",
    "is_available",
]

log = logging.getLogger(__name__)

NO_HPU_MESSAGE = (
    "No Gaudi HPU is usable: Intel's PyTorch bridge (`habana_frameworks.torch`) is not installed. On a Gaudi"
    " machine, install Intel Gaudi software and its PyTorch packages (or use Intel's Gaudi PyTorch container),"
    " see https://docs.habana.ai/en/latest/Installation_Guide/. To run the HPU code paths on the CPU instead, set"
    f" {EMULATE_ENV}=eager (or =lazy to emulate lazy mode with torch's Lazy Tensor Core)."
)


class HPUUnavailableError(RuntimeError):
    """Raised when an HPU is needed and neither Intel's bridge nor emulation provides one."""


_backends: dict[tuple[str, int, str], Backend] = {}


def _announce(backend: Backend) -> None:
    from lightning_gaudi.distributed.environment import InvalidLaunchError, LaunchEnvironment

    try:
        global_zero = LaunchEnvironment.from_env().is_global_zero
    except InvalidLaunchError:  # reported, naming the variable, when the strategy validates the launch
        global_zero = True
    if global_zero:
        log.warning(
            "lightning_gaudi: EMULATING %d %s HPU(s) on the CPU (%s=%s). Numbers from this run are CPU numbers,"
            " not Gaudi numbers.",
            backend.device_count(),
            backend.device_name(),
            EMULATE_ENV,
            backend.name,
        )


def get_backend() -> Backend:
    """The backend for this process's current settings (created once per distinct setting).

    Raises:
        ValueError: an emulation setting is malformed.
        HPUUnavailableError: no emulation is asked for and Intel's bridge is not installed.
    """
    mode = emulation_mode()
    key = ("habana", 0, "") if mode is None else (mode, runtime.emulated_devices(), runtime.emulated_device_name())
    backend = _backends.get(key)
    if backend is not None:
        return backend
    if mode is None:
        if not runtime.bridge_installed():
            raise HPUUnavailableError(NO_HPU_MESSAGE)
        from lightning_gaudi.hpu.bridge import HabanaBackend

        backend = HabanaBackend()
    elif mode == "eager":
        from lightning_gaudi.hpu.eager import EagerBackend

        backend = EagerBackend(key[1], key[2])
    else:
        from lightning_gaudi.hpu.lazy import LazyBackend

        backend = LazyBackend(key[2])
    if backend.emulated:
        _announce(backend)
    _backends[key] = backend
    return backend


def is_available() -> bool:
    """Whether an HPU (real or emulated) can be used. A malformed emulation setting still raises."""
    try:
        backend = get_backend()
    except HPUUnavailableError:
        return False
    return backend.is_available()
