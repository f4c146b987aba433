"""The process group's end at interpreter exit: a last barrier, then ``destroy_process_group``, before the teardown.

Why (issue 32 item 6): a gloo worker drops its references to a finished collective's work after ``wait()`` returned,
taking the GIL to do so (since torch 2.13). When the interpreter finalizes first (a collective in the script's last
milliseconds, as ``save_checkpoint``'s final barrier), CPython ends the worker inside a ``noexcept`` destructor and the
finished job aborts with SIGABRT (exit code 134). :func:`close_process_group` therefore runs, at exit, one last barrier
waited for with the GIL released, and keeps its work until the teardown, so the last reference to every work goes away
on the main thread; a failed process skips it (its peers may be in another collective). The exit has its own bound
(:func:`exit_timeout`). The process that started its node's other ranks (Lightning's launcher) watches them
(:func:`watch_ranks`): a rank that fails ends the job with its exit code, where Lightning's watcher would SIGKILL all.
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
    """Records that this process's run failed: the exit skips the last barrier and, given an ``exit_code``, ends the
    process with it (130 for a Ctrl-C, where Lightning exits 1)."""
    global _failed, _exit_code
    _failed, _exit_code = True, exit_code


def run_started() -> None:
    """A new run in this process (a notebook's next fit): the exit follows how it ends, not an earlier failure."""
    global _failed, _exit_code
    _failed, _exit_code = False, None


def exit_timeout(collective: timedelta) -> timedelta:
    """How long a finished rank waits at exit for the others: ``LIGHTNING_GAUDI_EXIT_TIMEOUT`` seconds if set, else
    20 s or the collective timeout ``collective``, whichever is shorter.

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
            f" waits at exit for the others, e.g. {EXIT_TIMEOUT_ENV}=60."
        )
    return timedelta(seconds=seconds)


def watch_ranks(procs: list[subprocess.Popen[bytes]], first_rank: int) -> None:
    """Watches the rank processes this process started (global ranks from ``first_rank``): one that fails, unless
    this process stopped it (:func:`stop_ranks`) or failed itself, ends the job with its exit code (:func:`end_job`)."""
    global _stopped
    _RANKS.clear()
    _RANKS.update(enumerate(procs, first_rank))
    _stopped = False
    threading.Thread(target=_watch, name="lightning_gaudi rank watcher", daemon=True).start()
    # Ctrl-C of this process alone reaches them too (SIGTERM is PreemptionCheckpoint's during fit)
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread() and callable(previous):
        signal.signal(signal.SIGINT, functools.partial(_forward, previous))


def _forward(previous: Callable[[int, Any], Any], signum: int, frame: Any) -> None:
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
    """Ends this process at once with ``code`` (``message`` on stderr first): kills the rank processes it started, runs
    the cleanups of :func:`cleanup_on_abort`, flushes stdout and stderr, and exits without the interpreter's teardown.
    Safe from any thread; the first caller's code wins."""
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
    """A barrier on the default group, waited for (at most ``timeout``) with the GIL released; its work is kept until
    the interpreter's teardown (see the module's docstring)."""
    options = dist.BarrierOptions()
    options.timeout = timeout
    group: Any = dist.group.WORLD
    work = group.barrier(options)
    _KEPT.append(work)
    work.wait(timeout)


def close_process_group(timeout: timedelta) -> None:
    """Ends the process group at exit (the last barrier, then ``destroy_process_group``) and waits for the rank
    processes this process started, all within ``timeout``: a rank that failed ends the job with its exit code, one
    still running is left to finish, with a warning. Errors are ignored: peers that are gone leave nothing to do."""
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
                f" rank finished; it is left to finish, outside the job's exit status ({EXIT_TIMEOUT_ENV}: the wait).",
                file=sys.stderr,
            )
    _check_ranks()
    if _exit_code is not None:
        end_job(_exit_code)
