"""Shared state of the bridge double: the call log and the settings tests configure.

The double's modules (``habana_frameworks.torch.*`` under ``tests/bridge_double``) record every call here as a
:class:`Call` and read the device they pretend to be from :data:`config`. Use it through the ``bridge_double``
fixture in ``tests/conftest.py``, which resets it around each test. A test makes the device run out of memory with
``memory={"Limit": ...}`` and :func:`run_ops` (what its ops would allocate): they raise :func:`out_of_memory_error`
when they run, at once in eager mode, at the next ``core.mark_step`` in lazy mode.
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
#: Device memory the ops recorded into the current lazy graph need (see :func:`run_ops`).
pending_graph_bytes = 0

#: What starts the bridge's error for device memory that ran out, after ``[Rank:N] `` (see :func:`out_of_memory_error`).
OUT_OF_MEMORY = "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::"


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


def visible_device_count() -> int:
    """The cards the double's ``hpu.device_count()`` reports: of the ``config.device_count`` cards of the machine,
    those ``HABANA_VISIBLE_MODULES`` lists where it is set (none when it is empty), as the bridge opens only those (Ray
    sets it to a worker's cards) and as the emulator counts them (``lightning_gaudi.hpu.runtime``)."""
    raw = os.environ.get("HABANA_VISIBLE_MODULES")
    if raw is None:
        return config.device_count
    ids = {part.strip() for part in raw.split(",") if part.strip()}
    return sum(1 for i in ids if i.isdigit() and int(i) < config.device_count)


def memory() -> dict[str, int]:
    return {key: int(config.memory.get(key, 0)) for key in MEMORY_STAT_KEYS}


def run_ops(nbytes: int) -> None:
    """Ops that need ``nbytes`` of device memory, as a test's model would run them: in eager mode they run now; in
    lazy mode they join the graph that the next ``core.mark_step`` launches. Running them raises
    :func:`out_of_memory_error` when ``InUse`` plus their bytes exceed a non-zero ``Limit``.

    The double cannot run ops, so a test says what its ops would allocate.
    """
    global pending_graph_bytes
    if is_lazy():
        pending_graph_bytes += int(nbytes)
    else:
        _run(int(nbytes))


def launch_graph() -> None:
    """What ``core.mark_step`` does with the pending lazy graph: runs it, or fails for want of memory."""
    global pending_graph_bytes
    needed, pending_graph_bytes = pending_graph_bytes, 0
    _run(needed)


def _run(nbytes: int) -> None:
    stats = memory()
    if stats["Limit"] and stats["InUse"] + nbytes > stats["Limit"]:
        raise out_of_memory_error(nbytes)


def out_of_memory_error(nbytes: int) -> RuntimeError:
    """The bridge's error when ops need more device memory than is free, a plain ``RuntimeError`` (the bridge throws
    ``c10::Error``, no ``torch.OutOfMemoryError``), worded as gaudi-pytorch-bridge v1.19.0 words it:

    - backend/synapse_helpers/device_memory.cpp:1060-1065 (``device_memory::get_pointer``): ``PT_DEVMEM_FATAL(
      "Allocation failed for size::", size, " (", static_cast<double>(size) / (1024 * 1024.), ")MB")``;
    - pytorch_helpers/habana_helpers/logging.h:317-342 (``PT_MOD_FATAL``): the exception's text is ``"[Rank:",
      get_rank(), "] ", "FATAL ERROR :: MODULE:", "PT_DEVMEM", " ", ...``, streamed by ``std::ostringstream``
      (logging.h:148-168): the size in decimal, the MiB as ``%g`` prints a double;
    - pytorch_helpers/habana_helpers/logging.cpp:169-176: the rank is ``RANK``, 0 when unset (read once per process
      by the bridge; the double reads it each time).
    """
    rank = os.environ.get("RANK", "").strip()
    rank = rank if rank.isdigit() else "0"
    return RuntimeError(f"[Rank:{int(rank)}] {OUT_OF_MEMORY}{nbytes} ({nbytes / (1024 * 1024.0):g})MB")
