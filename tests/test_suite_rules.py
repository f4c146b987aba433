"""The rules ``tests/conftest.py`` holds every test to: a quick test starts no Python process."""

from __future__ import annotations

import subprocess
import sys

import pytest


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
