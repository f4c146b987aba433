"""``run_once``: a job several tests read runs once per pytest run, whichever test worker asks first."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.shared_job import run_once


def test_a_job_runs_once_and_a_failed_job_runs_again(tmp_path_factory: pytest.TempPathFactory) -> None:
    calls: list[Path] = []

    def job(folder: Path) -> None:
        calls.append(folder)
        folder.mkdir()
        (folder / "result.txt").write_text(str(len(calls)))

    first = run_once(tmp_path_factory, "job-once", job)
    again = run_once(tmp_path_factory, "job-once", job)
    assert first == again
    assert calls == [first]
    assert (first / "result.txt").read_text() == "1"

    def failing(folder: Path) -> None:
        folder.mkdir()
        (folder / "partial.txt").write_text("half")
        raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        run_once(tmp_path_factory, "job-fails", failing)
    retried = run_once(tmp_path_factory, "job-fails", job)  # no mark was left: it runs, on a clean folder
    assert sorted(p.name for p in retried.iterdir()) == ["result.txt"]
