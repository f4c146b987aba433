"""The order the suite's tests run in: the slow ones first, spread evenly over pytest-xdist's workers.

``--dist worksteal`` (``addopts`` in ``pyproject.toml``) gives each of the ``n`` workers one consecutive ``n``-th of the
collected tests, then lets an idle worker take the second half of the longest queue left. Left in collection order,
a long test late in a worker's share (or a shared job, ``helpers.shared_job``, that another worker then waits for)
makes the tail of the run. :func:`order` lays the tests out so that each worker's share starts with an even part of
the slow work: the files of ``subprocess`` tests, whole (a file's tests may read one shared job), are dealt to the
shares by their estimated cost, largest first, each to the share with the least so far; the quick tests fill the
shares up to the sizes the scheduler cuts. Only the order changes: every test still runs, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

#: Seconds one worker spends on a file's ``subprocess`` tests, measured on the 2-core machine with the suite running
#: on three workers (``--durations``); a file not listed is estimated at :data:`DEFAULT_SECONDS` per test. Only the
#: order depends on these figures.
FILE_SECONDS: dict[str, float] = {}
DEFAULT_SECONDS = 10.0


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
    files: dict[str, list[T]] = {}
    quick: list[T] = []
    for item in items:
        if is_slow(item):
            files.setdefault(file_of(item), []).append(item)
        else:
            quick.append(item)

    def cost(name: str) -> float:
        return FILE_SECONDS.get(name, DEFAULT_SECONDS * len(files[name]))

    workers = max(1, workers)
    shares: list[list[T]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for name in sorted(files, key=lambda name: (-cost(name), name)):
        lightest = min(range(workers), key=lambda index: (loads[index], index))
        shares[lightest].extend(files[name])
        loads[lightest] += cost(name)
    ordered: list[T] = []
    start = 0
    for share, size in zip(shares, share_sizes(len(items), workers), strict=True):
        fill = max(0, size - len(share))
        ordered += share + quick[start : start + fill]
        start += fill
    return ordered + quick[start:]
