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
import sys
import time
from datetime import timedelta

atexit.register(sum, range(int(sys.argv[2])))  # a C call: no bytecode, so no GIL switch until it returns

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from shutdown_alone import load  # noqa: E402

close_process_group = load().close_process_group

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
atexit.register(close_process_group, timedelta(seconds=60))  # as the HPU strategies register it
held = (dist.group.WORLD, torch.ones(1000))  # the group outlives destroy_process_group; the tensor has a Python object
if dist.get_rank() == 0:
    time.sleep(float(sys.argv[1]))
    dist.all_reduce(held[1])
else:
    dist.all_reduce(held[1], async_op=True)
