"""The one seam between lightning_gaudi and whatever provides the HPU.

Every ``habana_frameworks`` and ``torch._lazy`` call in the package goes through :func:`get_backend`, which picks:

- ``LIGHTNING_GAUDI_EMULATE=eager``: :class:`~lightning_gaudi.hpu.eager.EagerBackend` (CPU tensors, gloo);
- ``LIGHTNING_GAUDI_EMULATE=lazy``: :class:`~lightning_gaudi.hpu.lazy.LazyBackend` (torch's Lazy Tensor Core);
- otherwise, when Intel's bridge is installed: :class:`~lightning_gaudi.hpu.bridge.HabanaBackend`.

Emulation settings: ``LIGHTNING_GAUDI_DEVICES`` (cards per node, default 8 like one Gaudi server; lazy emulation
always has one, see :mod:`~lightning_gaudi.hpu.lazy`) and
``LIGHTNING_GAUDI_DEVICE_NAME`` (``GAUDI``, ``GAUDI2`` or ``GAUDI3``; default ``GAUDI2``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

from lightning_gaudi.hpu.backend import GAUDI_NAMES, MEMORY_STAT_KEYS, Backend, ClipNorm, LazyCounters

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
    "bridge_installed",
    "bridge_loaded",
    "emulation_mode",
    "get_backend",
    "is_available",
]

EMULATE_ENV = "LIGHTNING_GAUDI_EMULATE"
DEVICES_ENV = "LIGHTNING_GAUDI_DEVICES"
DEVICE_NAME_ENV = "LIGHTNING_GAUDI_DEVICE_NAME"
EMULATION_MODES = ("eager", "lazy")
_DEFAULT_DEVICES = 8
_DEFAULT_DEVICE_NAME = "GAUDI2"

log = logging.getLogger(__name__)

NO_HPU_MESSAGE = (
    "No Gaudi HPU is usable: Intel's PyTorch bridge (`habana_frameworks.torch`) is not installed. On a Gaudi"
    " machine, install Intel Gaudi software and its PyTorch packages (or use Intel's Gaudi PyTorch container),"
    " see https://docs.habana.ai/en/latest/Installation_Guide/. To run the HPU code paths on the CPU instead, set"
    f" {EMULATE_ENV}=eager (or =lazy to emulate lazy mode with torch's Lazy Tensor Core)."
)


class HPUUnavailableError(RuntimeError):
    """Raised when an HPU is needed and neither Intel's bridge nor emulation provides one."""


def emulation_mode() -> str | None:
    """The emulation mode ``LIGHTNING_GAUDI_EMULATE`` asks for, or ``None`` for the real bridge.

    Raises:
        ValueError: the variable holds something other than ``eager`` or ``lazy``.
    """
    value = os.environ.get(EMULATE_ENV, "").strip().lower()
    if value in ("", "0", "off", "none"):
        return None
    if value not in EMULATION_MODES:
        raise ValueError(
            f"{EMULATE_ENV}={os.environ[EMULATE_ENV]!r} is not an emulation mode. Set it to 'eager' (HPU code paths"
            " on CPU tensors) or 'lazy' (torch's Lazy Tensor Core), or unset it to use a real Gaudi."
        )
    return value


def _emulated_devices() -> int:
    raw = os.environ.get(DEVICES_ENV, str(_DEFAULT_DEVICES))
    try:
        devices = int(raw)
    except ValueError:
        devices = -1
    if devices < 1:
        raise ValueError(f"{DEVICES_ENV}={raw!r} must be a positive integer: the number of emulated HPUs per node.")
    return devices


def _emulated_device_name() -> str:
    name = os.environ.get(DEVICE_NAME_ENV, _DEFAULT_DEVICE_NAME).strip().upper()
    if name not in GAUDI_NAMES:
        raise ValueError(
            f"{DEVICE_NAME_ENV}={name!r} is not a Gaudi generation; choose one of {', '.join(GAUDI_NAMES)}."
        )
    return name


def bridge_installed() -> bool:
    """Whether Intel's ``habana_frameworks`` package can be imported (without importing it)."""
    return importlib.util.find_spec("habana_frameworks") is not None


def bridge_loaded() -> bool:
    """Whether Intel's bridge has already been imported in this process."""
    return "habana_frameworks.torch" in sys.modules


_backends: dict[tuple[str, int, str], Backend] = {}


def _announce(backend: Backend) -> None:
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", os.environ.get("LOCAL_RANK", "0")))
    if rank == "0":
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
    key = ("habana", 0, "") if mode is None else (mode, _emulated_devices(), _emulated_device_name())
    backend = _backends.get(key)
    if backend is not None:
        return backend
    if mode is None:
        if not bridge_installed():
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
