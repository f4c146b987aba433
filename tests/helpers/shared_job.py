"""A training job that several tests read, run once per pytest run.

A module-scoped fixture runs once per test process; pytest-xdist's workers are several processes, so tests that read
one fixture can land on different workers and each would run the job again. ``run_once`` keeps the job's folder in
the temporary directory the workers share: the first worker to need it runs the job while holding a lock, the others
wait for the lock and read the folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_once(tmp_path_factory: pytest.TempPathFactory, name: str, job: Callable[[Path], None]) -> Path:
    """Returns ``<shared temp>/<name>`` after ``job`` has filled it, calling ``job`` only if no worker has yet.

    ``job`` gets a folder that does not exist yet and writes there whatever the tests read; a job that raises leaves
    no mark, so the next test to need it runs it again (and reports the same failure).
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # one folder per worker below a folder of the whole run
    folder = base / name
    done = base / f"{name}.done"
    with FileLock(base / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            job(folder)
            done.touch()
    return folder
