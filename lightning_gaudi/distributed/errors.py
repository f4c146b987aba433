"""Collective errors classified by cause: a stuck peer (:class:`CollectiveTimeoutError`), a dead peer
(:class:`PeerLostError`), or neither (passed through unchanged)."""

from __future__ import annotations

import re
from datetime import timedelta
from types import TracebackType

import torch.distributed as dist

_RESTART = (
    " Restart the job (torchrun --max-restarts N, SLURM --requeue) and resume with"
    " ckpt_path=lightning_gaudi.resume.resolve_ckpt_path('auto', <checkpoint dir>)."
)


class CollectiveError(RuntimeError):
    """A collective failed because of the other processes or the network; catch it to restart and resume."""


class CollectiveTimeoutError(CollectiveError):
    """A collective, or the process-group set-up, did not complete within the timeout: a peer hung or never started."""


class PeerLostError(CollectiveError):
    """A peer process's connection closed during a collective: the peer died (crash, kill, out of memory)."""


#: What gloo, the c10d store and NCCL-style backends say of a peer that is gone (lower case).
_LOST = re.compile(
    r"connection (closed|reset) by peer|connection refused|broken pipe|connection was likely closed|got 0 bytes"
    r"|remote process exited|end of file|\beof\b"
)
#: Texts of a peer that did not answer in time (gloo, the store, NCCL/HCCL watchdogs), lower case.
_TIMEOUT = re.compile("timed out|timeout|timing out")


def classify(err: BaseException) -> type[CollectiveError] | None:
    """:class:`CollectiveTimeoutError`, :class:`PeerLostError`, or ``None`` when ``err`` is not the transport's."""
    if isinstance(err, CollectiveError):
        return type(err)
    if not isinstance(err, RuntimeError):
        return None
    text = str(err).lower()
    lost, timed_out = _LOST.search(text) is not None, _TIMEOUT.search(text) is not None
    if isinstance(err, dist.DistStoreError):  # the store waited for a key in vain, unless its host is gone
        return PeerLostError if lost else CollectiveTimeoutError
    if isinstance(err, dist.DistNetworkError):  # a socket failed; a connect that timed out is a timeout
        return CollectiveTimeoutError if timed_out else PeerLostError
    if timed_out:
        return CollectiveTimeoutError
    return PeerLostError if lost else None


def translate_error(err: BaseException, what: str, timeout: timedelta) -> BaseException:
    """The :class:`CollectiveError` to raise for ``err`` from ``what``, or ``err`` itself when it is not one."""
    kind = classify(err)
    if kind is None or isinstance(err, CollectiveError):
        return err
    initialized = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else ("?", "?")
    if kind is CollectiveTimeoutError:
        why = f"a peer process did not answer within timeout={timeout} (it hangs, or a long save or compile holds it)"
    else:
        why = "a peer process died (its connection closed; its log shows why: a crash, an out-of-memory kill, or gloo's"
        why += " 'Received data size doesn't match expected size': the ranks passed different shapes or dtypes)"
    return kind(
        f"Rank {rank}/{world}: {what} failed: {why}.{_RESTART} Collectives wait timeout={timeout}, set by"
        f" HPUParallelStrategy(timeout=...). Cause: {type(err).__name__}: {err}"
    )


class _CollectiveErrors:
    """A plain class, not a generator: entering and leaving costs well under a µs."""

    __slots__ = ("timeout", "what")

    def __init__(self, what: str, timeout: timedelta) -> None:
        self.what = what
        self.timeout = timeout

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, RuntimeError) and not isinstance(exc, CollectiveError):
            translated = translate_error(exc, self.what, self.timeout)
            if translated is not exc:
                raise translated from exc


def collective_errors(what: str, timeout: timedelta) -> _CollectiveErrors:
    """A stateless, reusable context raising :func:`translate_error`'s error for a transport failure in the block."""
    return _CollectiveErrors(what, timeout)
