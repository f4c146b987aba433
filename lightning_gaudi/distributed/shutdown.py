"""The process group's end at interpreter exit: a last barrier, then ``destroy_process_group``, before the teardown.

Why (issue 32 item 6): a gloo worker thread drops its references to a finished collective's work after the caller's
``wait()`` has returned. Since torch 2.13 a C++ reference to a tensor that has a Python object holds that object, so
the worker takes the GIL to let go of it. When the interpreter starts finalizing before the worker got the GIL (a
collective in the last milliseconds of the script: Lightning's ``save_checkpoint`` ends with a broadcast and a
barrier), CPython ends the thread inside the work's ``noexcept`` destructor, and the process aborts with
"terminate called without an active exception" (SIGABRT, exit code 134) after a job that finished.

What :func:`close_process_group` does about it, once, at exit (the interpreter still whole): a last barrier on the
default group, waited for with the GIL released. A work that finished before it was either let go of by its worker
during that wait, or is still referenced (weakly) by the barrier, which waits for it; this module keeps the barrier's
work until the interpreter's own teardown, so the last reference to those works goes away on the main thread, never
on a worker. Then the process groups are destroyed. A process that fails (an uncaught exception, or a Trainer run
that raised) skips the barrier: its peers may be inside another collective.
"""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["close_process_group", "kept_barrier", "mark_failed", "run_started"]

#: The exit barrier's work: kept until the interpreter's teardown, which drops it on the main thread.
_KEPT: list[Any] = []
_failed = False


def mark_failed() -> None:
    """Records that this process's run failed: the exit skips the last barrier (its peers may be elsewhere)."""
    global _failed
    _failed = True


def run_started() -> None:
    """A new run in this process (a notebook's next fit): the exit follows how it ends, not an earlier failure."""
    global _failed
    _failed = False


def kept_barrier(timeout: timedelta) -> None:
    """A barrier on the default group, waited for with the GIL released; its work is kept until the interpreter's
    teardown, so gloo's workers let go of every earlier collective before the groups can be destroyed."""
    work = dist.barrier(async_op=True)
    _KEPT.append(work)
    work.wait(timeout)


def close_process_group(timeout: timedelta) -> None:
    """Ends the process group at exit: the last barrier (up to ``timeout``; see the module's docstring), then
    ``destroy_process_group``. Errors are ignored: peers that are gone leave nothing to do at exit."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not _failed and not hasattr(sys, "last_value"):  # set by the interpreter for an uncaught exception
        with contextlib.suppress(Exception):
            kept_barrier(timeout)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
