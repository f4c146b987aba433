"""An "HPU available" line beside Lightning's GPU and TPU lines when a Trainer is built.

Lightning lists the devices of a run in ``lightning.pytorch.trainer.setup._log_device_info``, which the end of
``Trainer.__init__`` calls as ``setup._log_device_info(self)``; it knows CUDA, MPS and XLA only, and no public hook
lets an accelerator add a line. The patch wraps that function: after Lightning's own lines, rank zero logs (with
Lightning's ``rank_zero_info``, like them) what runs on the HPU, the seam's :func:`~lightning_gaudi.hpu.device_summary`:
a Gaudi or the emulator, the mode, the cards used and the strategy. A trainer on another accelerator gets
``HPU available: <bool>, using: 0 HPUs``, without loading Intel's bridge. ``tests/patches/test_device_info.py`` fails
when Lightning moves the function or its call.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_gaudi.patches import registry

#: Lightning's module and function that log the device lines, called once per Trainer as ``setup._log_device_info``.
TARGET_MODULE = "lightning.pytorch.trainer.setup"
TARGET_NAME = "_log_device_info"
_MARK = "__lightning_gaudi_device_info__"


def _target() -> Callable[..., Any] | None:
    try:
        return getattr(importlib.import_module(TARGET_MODULE), TARGET_NAME, None)
    except ImportError:
        return None


def installed() -> bool:
    """Whether Lightning's device lines are followed by the HPU line."""
    return bool(getattr(_target(), _MARK, False))


def hpu_line(trainer: Any) -> str:
    """The HPU line for ``trainer`` (a ``lightning.pytorch.Trainer``)."""
    from lightning_gaudi import hpu
    from lightning_gaudi.accelerator import HPUAccelerator

    if isinstance(trainer.accelerator, HPUAccelerator):
        return hpu.device_summary(trainer.num_devices, type(trainer.strategy).__name__, trainer.num_nodes)
    try:  # nothing is loaded for a trainer that does not use the HPU
        available = hpu.emulation_mode() is not None or hpu.bridge_installed()
    except ValueError:
        available = False
    return f"HPU available: {available}, using: 0 HPUs"


def install() -> bool:
    """Wraps Lightning's device-info logging (idempotent). Returns whether the HPU line is logged.

    On a Lightning outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or without the function, a
    warning says what is missing: only the line; the run summary still names the device and the strategy.
    """
    if installed():
        return True
    original = _target()
    supported = registry.LIGHTNING_SUPPORTED
    if not supported or original is None:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" {TARGET_MODULE}.{TARGET_NAME}: {'missing' if original is None else 'found'}). The Trainer will not"
            " log an 'HPU available' line beside Lightning's GPU and TPU lines; everything else works.",
            stacklevel=2,
        )
        return False

    @functools.wraps(original)
    def log_device_info(trainer: Any) -> None:
        original(trainer)
        rank_zero_info(hpu_line(trainer))

    setattr(log_device_info, _MARK, True)
    setattr(importlib.import_module(TARGET_MODULE), TARGET_NAME, log_device_info)
    return True


PATCH = registry.Patch(
    name="device_info",
    targets=(f"{TARGET_MODULE}.{TARGET_NAME}",),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
