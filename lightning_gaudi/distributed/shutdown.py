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

The exit has its own bound (:func:`exit_timeout`: 20 s unless ``LIGHTNING_GAUDI_EXIT_TIMEOUT`` says otherwise), not the
collective timeout: a rank still working after ``fit`` must not hold the others for minutes. The process that started
the other ranks of its node (Lightning's launcher: rank 0) watches them (:func:`watch_ranks`) and, at exit, waits
for them within the same bound: a rank that failed or was killed ends the job with its exit code, named on stderr
("lightning_gaudi: rank 1 failed with exit code 3"), where Lightning's own watcher would SIGKILL every process.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

__all__ = [
    "EXIT_TIMEOUT_ENV",
    "cleanup_on_abort",
    "close_process_group",
    "end_job",
    "exit_timeout",
    "kept_barrier",
    "mark_failed",
    "run_started",
    "stop_ranks",
    "watch_ranks",
]

#: Seconds a finished rank waits at exit for the others (the exit barrier, then the ranks it started).
EXIT_TIMEOUT_ENV = "LIGHTNING_GAUDI_EXIT_TIMEOUT"
DEFAULT_EXIT_TIMEOUT = timedelta(seconds=20)
_POLL_S = 0.5
_SETTLE_S = 2.0

#: The exit barrier's work: kept until the interpreter's teardown, which drops it on the main thread.
_KEPT: list[Any] = []
_failed = False
_exit_code: int | None = None
#: The rank processes this process started, by global rank; ``_stopped``: this process stopped them itself.
_RANKS: dict[int, subprocess.Popen[bytes]] = {}
_stopped = False
_CLEANUPS: list[Callable[[], None]] = []
_ENDING = threading.Lock()


def mark_failed(exit_code: int | None = None) -> None:
    """Records that this process's run failed: the exit skips the last barrier (its peers may be elsewhere) and,
    given an ``exit_code``, ends the process with it (130 for a Ctrl-C, where Lightning exits 1)."""
    global _failed, _exit_code
    _failed = True
    _exit_code = exit_code


def run_started() -> None:
    """A new run in this process (a notebook's next fit): the exit follows how it ends, not an earlier failure."""
    global _failed, _exit_code
    _failed = False
    _exit_code = None


def exit_timeout(collective: timedelta) -> timedelta:
    """How long a finished rank waits at exit for the others: ``LIGHTNING_GAUDI_EXIT_TIMEOUT`` seconds if set, else
    20 s (so that rank 0 is gone within 30 s of its fit, teardown included), or ``collective`` (the collective
    timeout) if that is shorter.

    Raises:
        ValueError: the variable is not a number of seconds of at least 0.
    """
    text = os.environ.get(EXIT_TIMEOUT_ENV, "").strip()
    if not text:
        return min(collective, DEFAULT_EXIT_TIMEOUT)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"{EXIT_TIMEOUT_ENV}={text!r} must be a number of seconds (at least 0): how long a rank that finished"
            f" waits at exit for the others, e.g. {EXIT_TIMEOUT_ENV}=60. Unset, it is 20."
        )
    return timedelta(seconds=seconds)


def watch_ranks(procs: list[subprocess.Popen[bytes]], first_rank: int) -> None:
    """Watches the rank processes this process started (global ranks ``first_rank``, ``first_rank + 1``, ...): one
    that fails or is killed, unless this process stopped it (:func:`stop_ranks`) or failed itself, ends the job with
    its exit code (:func:`end_job`)."""
    global _stopped
    _RANKS.clear()
    _RANKS.update(enumerate(procs, first_rank))
    _stopped = False
    threading.Thread(target=_watch, name="lightning_gaudi rank watcher", daemon=True).start()
    # Ctrl-C of this process alone reaches them too; SIGTERM is PreemptionCheckpoint's during fit (a handler here would
    # join Lightning's and end this process at once)
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread() and callable(previous):
        signal.signal(signal.SIGINT, functools.partial(_forward, previous))


def _forward(previous: Callable[[int, Any], Any], signum: int, frame: Any) -> None:
    """Passes ``signum`` on to the ranks this process started, then handles it as before."""
    stop_ranks(signum)
    previous(signum, frame)


def _watch() -> None:
    while all(proc.poll() in (None, 0) for proc in _RANKS.values()):
        if all(proc.returncode == 0 for proc in _RANKS.values()):
            return
        time.sleep(_POLL_S)
    time.sleep(_SETTLE_S)  # if this process fails too (a peer lost in a collective), its own error says more
    _check_ranks()


def _check_ranks() -> None:
    for rank, proc in _RANKS.items():
        code = proc.poll()
        if code and not _stopped and not _failed:
            exit_code = code if code > 0 else 128 - code
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"failed with exit code {code}"
            end_job(exit_code, f"lightning_gaudi: rank {rank} {how}; the job ends with exit code {exit_code}")


def stop_ranks(signum: int) -> None:
    """Sends ``signum`` to the rank processes this process started that still run; their exits are no failures."""
    global _stopped
    _stopped = True
    for proc in _RANKS.values():
        if proc.poll() is None:
            proc.send_signal(signum)


@contextlib.contextmanager
def cleanup_on_abort(cleanup: Callable[[], None]) -> Iterator[None]:
    """Runs ``cleanup`` (e.g. removing a save's temporaries) if :func:`end_job` ends this process meanwhile."""
    _CLEANUPS.append(cleanup)
    try:
        yield
    finally:
        _CLEANUPS.remove(cleanup)


def end_job(code: int, message: str = "") -> NoReturn:
    """Ends this process at once with ``code`` (``message`` on stderr first): kills the rank processes it started
    (they may wait in a collective), runs the cleanups of :func:`cleanup_on_abort`, flushes stdout and stderr, and
    exits without the interpreter's teardown. Safe from any thread; the first caller's code wins."""
    _ENDING.acquire()
    if message:
        print(message, file=sys.stderr)
    stop_ranks(signal.SIGKILL)
    for proc in _RANKS.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)  # gone before the cleanups remove what it was writing
    for cleanup in reversed(_CLEANUPS):
        with contextlib.suppress(Exception):
            cleanup()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def kept_barrier(timeout: timedelta) -> None:
    """A barrier on the default group, waited for with the GIL released; its work is kept until the interpreter's
    teardown, so gloo's workers let go of every earlier collective before the groups can be destroyed. The barrier
    itself ends after ``timeout`` too: a pending one holds ``destroy_process_group`` until it ends."""
    options = dist.BarrierOptions()
    options.timeout = timeout
    group: Any = dist.group.WORLD
    work = group.barrier(options)
    _KEPT.append(work)
    work.wait(timeout)


def close_process_group(timeout: timedelta) -> None:
    """Ends the process group at exit: the last barrier, then ``destroy_process_group``; then waits for the rank
    processes this process started. All within ``timeout`` (:func:`exit_timeout`; see the module's docstring): a rank
    that failed ends the job with its exit code, one still running past it is left to finish, with a warning.
    Errors are ignored: peers that are gone leave nothing to do at exit."""
    deadline = time.monotonic() + timeout.total_seconds()
    if hasattr(sys, "last_value"):
        stop_ranks(signal.SIGKILL)  # this process failed: its peers would wait for it in a collective
    if dist.is_available() and dist.is_initialized():
        if not _failed and not hasattr(sys, "last_value"):  # set by the interpreter for an uncaught exception
            with contextlib.suppress(Exception):
                kept_barrier(timeout)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    for rank, proc in _RANKS.items():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        if proc.returncode is None:
            print(
                f"lightning_gaudi: rank {rank} (pid {proc.pid}) still runs {timeout.total_seconds():g}s after this"
                f" rank finished; it is left to finish, outside this job's exit status ({EXIT_TIMEOUT_ENV} sets how"
                " long to wait).",
                file=sys.stderr,
            )
    _check_ranks()
    if _exit_code is not None:
        end_job(_exit_code)
