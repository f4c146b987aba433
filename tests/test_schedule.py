"""The suite's order (``tests/helpers/schedule.py``): the slow files spread over pytest-xdist's workers, each at the
front of a worker's first share as ``--dist worksteal`` cuts them."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import schedule
from xdist.scheduler import WorkStealingScheduling

COSTS = {"a.py": 100.0, "b.py": 60.0, "c.py": 50.0, "d.py": 40.0}


def _items() -> list[tuple[str, str, bool]]:
    """(file, name, slow): quick tests interleaved with the slow files, as collection finds them."""
    items = [("q0.py", f"q{i}", False) for i in range(30)]
    for name, cost in COSTS.items():
        items += [(name, f"{name}-{i}", True) for i in range(int(cost // 20))]
        items += [(f"q-{name}", f"q-{name}-{i}", False) for i in range(20)]
    items += [("e.py", "e0", True), ("e.py", "e1", True)]  # not in FILE_SECONDS: 2 x DEFAULT_SECONDS
    return items


def _order(items: list[tuple[str, str, bool]], workers: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(schedule, "FILE_SECONDS", COSTS)
    return schedule.order(items, workers, file_of=lambda item: item[0], is_slow=lambda item: item[2])


class _Worker:
    """What the scheduler sends a worker, recorded."""

    shutting_down = False

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


class _Config:
    def getvalue(self, name: str) -> list[str]:
        assert name == "tx"
        return ["3*popen"]


def _first_shares(collection: list[str]) -> list[list[str]]:
    """The tests pytest-xdist's work-stealing scheduler gives each of 3 workers at the start."""
    scheduler = WorkStealingScheduling(_Config())  # type: ignore[arg-type]
    workers = [_Worker(f"gw{index}") for index in range(3)]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
    for worker in workers:
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    return [[collection[index] for index in worker.sent] for worker in workers]


def test_only_the_order_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    items = _items()
    for workers in (1, 2, 3, 4):
        ordered = _order(items, workers, monkeypatch)
        assert Counter(ordered) == Counter(items)
        # within a file, and among the quick tests, collection order stays
        for name in {file for file, _, _ in items}:
            assert [i for i in ordered if i[0] == name] == [i for i in items if i[0] == name]
        assert [i for i in ordered if not i[2]] == [i for i in items if not i[2]]


def test_each_workers_first_share_starts_with_an_even_part_of_the_slow_files(monkeypatch: pytest.MonkeyPatch) -> None:
    items = _items()
    ordered = _order(items, 3, monkeypatch)
    shares = _first_shares([f"{file}::{name}" for file, name, _ in ordered])
    assert sum(len(share) for share in shares) == len(items)
    slow = {f"{file}::{name}" for file, name, is_slow in items if is_slow}
    files_per_share = []
    for share in shares:
        leading = share[: sum(test in slow for test in share)]
        assert set(leading) <= slow, "a quick test runs before a slow one of the same worker"
        files_per_share.append(sorted({test.split("::")[0] for test in leading}))
    # largest first, each to the least loaded worker: 100 | 60 + 20 (e.py) | 50 + 40
    assert sorted(files_per_share) == [["a.py"], ["b.py", "e.py"], ["c.py", "d.py"]]


def test_without_workers_the_slow_files_run_first_largest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    ordered = _order(_items(), 1, monkeypatch)
    slow_files = [file for file, _, is_slow in ordered if is_slow]
    assert list(dict.fromkeys(slow_files)) == ["a.py", "b.py", "c.py", "d.py", "e.py"]
    assert all(is_slow for _, _, is_slow in ordered[: len(slow_files)])


@pytest.mark.parametrize(("total", "workers"), [(10, 3), (1414, 3), (7, 4), (5, 1)])
def test_share_sizes_add_up(total: int, workers: int) -> None:
    sizes = schedule.share_sizes(total, workers)
    assert sum(sizes) == total
    assert max(sizes) - min(sizes) <= 1


def test_files_that_share_a_job_go_to_one_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "SAME_SHARE", {"c.py": "a.py"})
    items = _items()
    shares = _first_shares([f"{file}::{name}" for file, name, _ in _order(items, 3, monkeypatch)])
    (together,) = [share for share in shares if any(test.startswith("a.py::") for test in share)]
    assert sum(test.startswith("c.py::") for test in together) == int(COSTS["c.py"] // 20)


def test_a_quick_test_that_starts_python_fails_naming_the_mark() -> None:
    import conftest

    conftest.audit_python_starts("subprocess.Popen", ("g++", ["g++", "--version"], None, None))  # not Python
    assert conftest.PYTHON_STARTS == []
    conftest.audit_python_starts("subprocess.Popen", (None, [sys.executable, "-c", "pass"], None, None))
    try:
        assert [str([sys.executable, "-c", "pass"])] == conftest.PYTHON_STARTS
    finally:
        conftest.PYTHON_STARTS.clear()  # this test started nothing: its own teardown check passes


@pytest.mark.subprocess
def test_a_test_marked_subprocess_may_start_python() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    import conftest

    assert conftest.PYTHON_STARTS == []
