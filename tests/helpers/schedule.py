"""The order the suite's tests run in: the slow ones first, spread evenly over pytest-xdist's workers.

``--dist worksteal`` (``addopts`` in ``pyproject.toml``) gives each of the ``n`` workers one consecutive ``n``-th of the
collected tests, then lets an idle worker take the second half of the longest queue left. Left in collection order,
a long test late in a worker's share (or a shared job, ``helpers.shared_job``, that another worker then waits for)
makes the tail of the run. :func:`order` lays the tests out so that each worker's share starts with an even part of
the slow work: the files of ``subprocess`` tests, whole (a file's tests may read one shared job; files that share one
go together, :data:`SAME_SHARE`), are dealt to the shares by their estimated cost, largest first, each to the share
with the least so far; the quick tests fill the shares up to the sizes the scheduler cuts. Only the order changes:
every test still runs, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

#: Seconds one worker spends on a file's ``subprocess`` tests, rounded, from ``--durations`` of whole-suite runs on
#: three workers on the 2-core machine (files that no such run listed: their runs alone, scaled by the same
#: machine's load); a file not listed is estimated at :data:`DEFAULT_SECONDS` per test. Only the order depends on
#: these figures: a file whose tests grow slower or faster than its figure moves earlier or later, nothing fails.
FILE_SECONDS: dict[str, float] = {
    "callbacks/test_preemption.py": 170,
    "callbacks/test_preemption_sharded_save.py": 20,
    "distributed/test_collective_faults.py": 20,
    "distributed/test_forward_faults.py": 15,
    "distributed/test_kubernetes.py": 20,
    "distributed/test_launcher.py": 15,
    "distributed/test_mpi.py": 45,
    "distributed/test_reliability.py": 100,
    "fabric/test_fabric_ddp.py": 35,
    "fabric/test_model_parallel.py": 40,
    "integration/test_hf_lora.py": 50,
    "integration/test_litgpt.py": 130,
    "integration/test_ray_train.py": 80,
    "recipes/test_benchmarks.py": 95,
    "recipes/test_examples.py": 120,
    "recipes/test_sweep.py": 70,
    "routing/test_objects_emulated.py": 50,
    "strategies/test_clean_exit.py": 80,
    "strategies/test_deepspeed_emulated.py": 150,
    "strategies/test_fsdp.py": 1,
    "strategies/test_fsdp_emulated.py": 140,
    "strategies/test_model_parallel.py": 130,
    "strategies/test_parallel_compile.py": 40,
    "strategies/test_parallel_emulated.py": 90,
    "test_architecture.py": 10,
    "test_checkpoint_io.py": 10,
    "test_cli.py": 20,
    "test_doctor.py": 70,
    "test_main.py": 60,
    "test_schedule.py": 1,
}
DEFAULT_SECONDS = 10.0
#: Files whose tests read one shared job (``helpers.shared_job.run_once``): each goes to the share of the file named,
#: so no worker waits for the job another one runs.
SAME_SHARE = {
    "distributed/test_kubernetes.py": "distributed/test_reliability.py",  # the 2-node torchrun job, "two-nodes"
    "distributed/test_mpi.py": "distributed/test_reliability.py",
}


def share_sizes(total: int, workers: int) -> list[int]:
    """How many tests each worker's first share holds: what ``--dist worksteal`` sends each idle worker at the
    start (the pending tests divided by the workers still to serve, rounded down)."""
    sizes = []
    for index in range(workers):
        size = total // (workers - index)
        sizes.append(size)
        total -= size
    return sizes


def order(items: Sequence[T], workers: int, file_of: Callable[[T], str], is_slow: Callable[[T], bool]) -> list[T]:
    """``items`` reordered: the slow files dealt evenly to ``workers`` shares, each at the front of its share.

    Args:
        items: the collected tests, in collection order (kept within a file and among the quick tests).
        workers: the number of pytest-xdist workers (1 without xdist: the slow files first, largest first).
        file_of: a test's file, relative to ``tests/`` (the key of :data:`FILE_SECONDS`).
        is_slow: whether a test starts processes (the ``subprocess`` mark).
    """
    units: dict[str, list[T]] = {}  # the slow tests of a file, or of the files that share a job
    counts: dict[str, int] = {}
    quick: list[T] = []
    for item in items:
        if is_slow(item):
            file = file_of(item)
            units.setdefault(SAME_SHARE.get(file, file), []).append(item)
            counts[file] = counts.get(file, 0) + 1
        else:
            quick.append(item)

    def cost(unit: str) -> float:
        files = [file for file in counts if SAME_SHARE.get(file, file) == unit]
        return sum(FILE_SECONDS.get(file, DEFAULT_SECONDS * counts[file]) for file in files)

    workers = max(1, workers)
    shares: list[list[T]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for unit in sorted(units, key=lambda unit: (-cost(unit), unit)):
        lightest = min(range(workers), key=lambda index: (loads[index], index))
        shares[lightest].extend(units[unit])
        loads[lightest] += cost(unit)
    ordered: list[T] = []
    start = 0
    for share, size in zip(shares, share_sizes(len(items), workers), strict=True):
        fill = max(0, size - len(share))
        ordered += share + quick[start : start + fill]
        start += fill
    return ordered + quick[start:]
