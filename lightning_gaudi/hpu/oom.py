"""Out of device memory in Intel's bridge's own words: the recogniser every backend's ``is_out_of_memory`` uses, and
the message an emulated card quotes.

From gaudi-pytorch-bridge v1.19.0: the bridge raises a plain ``RuntimeError``, ``"[Rank:<RANK>] FATAL ERROR ::
MODULE:<module> <arguments>"`` streamed by ``std::ostringstream`` (pytorch_helpers/habana_helpers/logging.h:148-168,
317-342; logging.cpp:169-193), maybe followed by a backtrace, so the wordings are searched for, not matched whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

#: The bridge's default allocator (``PT_HPU_POOL_STRATEGY`` 4, scripts/env_flags.yaml:518-520) hands out handles and
#: allocates when a graph first needs the memory; when that fails after waiting for running graphs and defragmenting:
#: ``PT_DEVMEM_FATAL("Allocation failed for size::", size, " (", static_cast<double>(size) / (1024 * 1024.), ")MB")``
#: (gaudi-pytorch-bridge v1.19.0, backend/synapse_helpers/device_memory.cpp:1060-1065, ``device_memory::get_pointer``).
DEVMEM_ALLOCATION_FAILED = re.compile(
    r"\[Rank:\d+\] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::(?P<size>\d+) \([0-9.e+-]+\)MB"
)
#: The scratch memory a graph runs in: ``PT_SYNHELPER_FATAL("workspace Allocation of size ::", size, " failed!")``
#: (gaudi-pytorch-bridge v1.19.0, backend/synapse_helpers/device.cpp:1608, ``device::get_workspace_buffer``).
WORKSPACE_ALLOCATION_FAILED = re.compile(
    r"\[Rank:\d+\] FATAL ERROR :: MODULE:PT_SYNHELPER workspace Allocation of size ::(?P<size>\d+) failed!"
)
#: Without the pool (``PT_HPU_POOL_STRATEGY=0``) the tensor allocator fails at once: ``TORCH_HABANA_CHECK(status,
#: "allocate failed to allocate ", num_bytes, " bytes")`` (gaudi-pytorch-bridge v1.19.0,
#: backend/habana_device/HPUAllocator.cpp:204-205), which ``TORCH_CHECK``s ``"synStatus=", status, " [", name, "] "``
#: before it (pytorch_helpers/habana_helpers/logging.h:540-553).
ALLOCATOR_ALLOCATION_FAILED = re.compile(r"synStatus=\S+ \[[^\]]*\] allocate failed to allocate (?P<size>\d+) bytes")
#: Every wording of the bridge for device memory that ran out.
BRIDGE_OUT_OF_MEMORY = (DEVMEM_ALLOCATION_FAILED, WORKSPACE_ALLOCATION_FAILED, ALLOCATOR_ALLOCATION_FAILED)


def bridge_rank(environ: Mapping[str, str] | None = None) -> int:
    """The rank the bridge puts in its messages: ``RANK``, 0 when unset or not a number (logging.cpp:169-176)."""
    value = (os.environ if environ is None else environ).get("RANK", "").strip()
    return int(value) if value.isdigit() else 0


def allocation_failed_message(nbytes: int, rank: int | None = None) -> str:
    """What the bridge says when the card cannot hold ``nbytes`` more (:data:`DEVMEM_ALLOCATION_FAILED`)."""
    rank = bridge_rank() if rank is None else rank
    return f"[Rank:{rank}] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::{nbytes} ({nbytes / 2**20:g})MB"


def is_bridge_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is the bridge's ``RuntimeError`` for device memory that ran out."""
    return isinstance(error, RuntimeError) and any(pattern.search(str(error)) for pattern in BRIDGE_OUT_OF_MEMORY)
