"""Shared state of the bridge double: the call log and the settings tests configure.

The double's modules (``habana_frameworks.torch.*`` under ``tests/bridge_double``) record every call here as a
:class:`Call` and read the device they pretend to be from :data:`config`. Use it through the ``bridge_double``
fixture in ``tests/conftest.py``, which resets it around each test. A test makes the device run out of memory with
:func:`queue_graph_bytes` (what the current lazy graph would allocate) and ``memory={"Limit": ...}``: the next
``core.mark_step`` then raises :func:`out_of_memory_error`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Call:
    """One call into the double: ``name`` is the qualified name, e.g. ``"hpu.memory_stats"``."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Config:
    """The device the double pretends to be.

    Attributes:
        device_count: what ``hpu.device_count()`` returns.
        device_name: what ``hpu.get_device_name()`` returns (``GAUDI``, ``GAUDI2``, ``GAUDI3``).
        lazy: what ``core.is_lazy()`` returns; ``None`` follows ``PT_HPU_LAZY_MODE`` like bridge 1.19 (default lazy).
        memory: ``memory_stats()`` values; missing keys read 0.
        metrics: ``metric_global(name).stats()`` per metric name.
    """

    device_count: int = 8
    device_name: str = "GAUDI2"
    lazy: bool | None = None
    memory: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)


calls: list[Call] = []
config = Config()
#: Device memory the ops recorded into the current lazy graph need (see :func:`queue_graph_bytes`).
pending_graph_bytes = 0

#: The phrase of the double's out-of-memory error. Intel's documentation (../shared/habana-api.md and the seeds)
#: speaks of "out of memory (OOM)" but does not show the bridge's exception text; the double carries that phrase.
OUT_OF_MEMORY = "out of memory"


def record(name: str, *args: Any, **kwargs: Any) -> None:
    """Appends a call to the log."""
    calls.append(Call(name, args, kwargs))


def called(name: str) -> list[Call]:
    """The logged calls with this qualified name, oldest first."""
    return [call for call in calls if call.name == name]


def names() -> list[str]:
    """The qualified names of all logged calls, oldest first."""
    return [call.name for call in calls]


def reset() -> None:
    """Empties the call log (the device settings stay)."""
    calls.clear()


def restore_defaults() -> None:
    """Empties the call log and restores the default device (see :class:`Config`)."""
    global config, pending_graph_bytes
    calls.clear()
    config = Config()
    pending_graph_bytes = 0


def configure(**settings: Any) -> None:
    """Changes the device the double pretends to be (see :class:`Config`)."""
    for key, value in settings.items():
        if not hasattr(config, key):
            raise AttributeError(f"the bridge double has no setting {key!r}")
        setattr(config, key, value)


def is_lazy() -> bool:
    if config.lazy is not None:
        return config.lazy
    return os.getenv("PT_HPU_LAZY_MODE", "1") != "0"


def memory() -> dict[str, int]:
    return {key: int(config.memory.get(key, 0)) for key in MEMORY_STAT_KEYS}


def queue_graph_bytes(nbytes: int) -> None:
    """Records that ops added to the current lazy graph need ``nbytes`` of device memory when it runs.

    The double cannot run ops, so a test says what its graph would allocate; the next ``core.mark_step`` launches
    the graph and raises :func:`out_of_memory_error` when ``InUse`` plus the pending bytes exceed ``Limit``.
    """
    global pending_graph_bytes
    pending_graph_bytes += int(nbytes)


def launch_graph() -> None:
    """What ``core.mark_step`` does with the pending graph: runs it (frees it) or fails for want of memory."""
    global pending_graph_bytes
    needed, pending_graph_bytes = pending_graph_bytes, 0
    stats = memory()
    if stats["Limit"] and stats["InUse"] + needed > stats["Limit"]:
        raise out_of_memory_error(needed)


def out_of_memory_error(nbytes: int) -> RuntimeError:
    """The error the double raises when a graph needs more device memory than is free (see :data:`OUT_OF_MEMORY`)."""
    stats = memory()
    free = stats["Limit"] - stats["InUse"]
    return RuntimeError(f"HPU {OUT_OF_MEMORY}: a graph needs {nbytes} bytes, {free} of {stats['Limit']} are free")
