"""Issue 32 item 6 made deterministic, for ``tests/distributed/test_shutdown.py``: a gloo collective that finishes while
the interpreter exits, on a process group something still holds (as a ``DeviceMesh`` does).

Run as ``python exit_race.py DELAY HOLD`` on 2 ranks (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` set).
Rank 1 starts an all-reduce and exits at once; rank 0 joins it ``DELAY`` seconds later. Rank 1's last exit function
(registered first, so it runs last) sums ``range(HOLD)`` in C, holding the GIL without a switch: the all-reduce
finishes meanwhile, and its gloo worker waits for the GIL into the interpreter's finalization. Without the product's
exit hook this rank aborts ("terminate called without an active exception", SIGABRT); the hook lets go of the work
before the finalization, and both ranks exit 0.
"""

from __future__ import annotations

import atexit
import importlib.util
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType

atexit.register(sum, range(int(sys.argv[2])))  # a C call: no bytecode, so no GIL switch until it returns

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _load_shutdown() -> ModuleType:
    """``lightning_gaudi.distributed.shutdown`` from its file alone (it imports torch and the standard library only):
    importing it through its package would import Lightning first, seconds of CPU per rank the race does not need."""
    package = importlib.util.find_spec("lightning_gaudi")  # finds the package without importing it
    assert package is not None
    assert package.origin is not None
    spec = importlib.util.spec_from_file_location(
        "lightning_gaudi_shutdown", Path(package.origin).parent / "distributed" / "shutdown.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


close_process_group = _load_shutdown().close_process_group

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
atexit.register(close_process_group, timedelta(seconds=60))  # as the HPU strategies register it
held = (dist.group.WORLD, torch.ones(1000))  # the group outlives destroy_process_group; the tensor has a Python object
if dist.get_rank() == 0:
    time.sleep(float(sys.argv[1]))
    dist.all_reduce(held[1])
else:
    dist.all_reduce(held[1], async_op=True)
