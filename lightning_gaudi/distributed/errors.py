"""Collective errors, classified by what really happened: a peer that is stuck, a peer that died, or neither.

:func:`collective_errors` guards every collective of :class:`~lightning_gaudi.strategies.HPUParallelStrategy` (barrier,
broadcast, all_gather, all_reduce, the gradient all-reduce in ``backward``). A failure of the transport becomes

- :class:`CollectiveTimeoutError`: a peer did not answer within the timeout (it hangs, or is stuck elsewhere);
- :class:`PeerLostError`: a peer's connection closed: it died (crashed, was killed, ran out of memory);

both :class:`CollectiveError`, with the rank, the operation, the timeout and how to restart and resume. Anything else
(a user error such as a bad argument, or ``backward``'s own errors) passes through unchanged.

What torch 2.13 with gloo raises, observed with 2 processes on 127.0.0.1 (``tests/distributed/test_errors.py`` keeps
these texts, and ``tests/distributed/test_collective_faults.py`` provokes them for real):

- a peer exits before or during ``barrier``/``all_reduce``/``all_gather``/``broadcast`` or DDP's gradient all-reduce:
  ``RuntimeError('[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6291. This is
  typically caused by a remote worker crashing. ...')``;
- a peer sleeps past the process group's timeout (3 s): ``RuntimeError('[.../gloo/transport/tcp/unbound_buffer.cc:78]
  Timed out waiting 3000ms for recv operation to complete')`` (``...:129] ... for send operation ...`` for
  ``all_gather`` and ``broadcast``); every later collective of that group then fails at once with
  ``RuntimeError('Application timeout caused pair closure')``;
- ``all_gather`` of different shapes, or ``all_reduce`` of different sizes or of dtypes of different widths: no Python
  error. The rank that receives more bytes than it expects is aborted by gloo (``SIGABRT``, ``terminate called after
  throwing an instance of 'gloo::EnforceNotMet' ... op.preamble.length <= op.nbytes. 6 vs 4. Received data size
  doesn't match expected size. Is there a distributed collective mismatch in your code?``); its peer either returns
  wrong data silently or fails with ``RuntimeError('[.../pair.cc:537] Read error [127.0.0.1]:57500: Connection reset
  by peer. This is typically caused by a remote worker hanging or bugs in the application. ...')``. Dtypes of the same
  width (float32 and int32) reduce silently into garbage. Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch checks first
  and every rank raises ``RuntimeError('Detected mismatch between collectives on ranks. Rank 0 is running
  collective: CollectiveFingerPrint(... OpType=ALLGATHER, TensorShape=[2] ...), but Rank 1 is running collective:
  ...')``. The strategy therefore checks shapes and dtypes itself before ``all_gather`` and a non-scalar ``reduce``
  (:func:`lightning_gaudi.distributed.consistency.check_same_layout`);
- a bad argument: ``RuntimeError('ProcessGroupGloo::broadcast: invalid root rank: 5')``, ``RuntimeError("result
  type Float can't be cast to the desired output type Bool")`` (``AVG`` of a bool tensor) on every rank;
- the store (process-group set-up): nobody listening, ``DistNetworkError('The client socket has timed out after
  1000ms while trying to connect to (127.0.0.1, 55105).')``; a key never set, ``DistStoreError('wait timeout after
  1000ms, keys: /missing')``; the store's host died, ``DistNetworkError('Failed to recv, got 0 bytes. Connection was
  likely closed. Did the remote server shutdown or crash?')``.

Gloo raises plain ``RuntimeError`` for every collective fault above; only the store uses torch's ``DistError`` types.
So the classification looks at the type where torch gives one (``DistStoreError``: a wait in vain, a timeout;
``DistNetworkError``: a socket failure, a lost peer unless it timed out), then at the text. A ``DistBackendError``
(NCCL-style backends) is judged by its text like a plain ``RuntimeError``: it also carries usage errors.
"""

from __future__ import annotations

import re
from datetime import timedelta
from types import TracebackType

import torch.distributed as dist

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "PeerLostError",
    "classify",
    "collective_errors",
    "translate_error",
]

_RESTART = (
    " Restart the job (torchrun --max-restarts N, SLURM --requeue) and resume with"
    " ckpt_path=lightning_gaudi.resume.resolve_ckpt_path('auto', <checkpoint dir>)."
)


class CollectiveError(RuntimeError):
    """A collective failed because of the other processes or the network, not because of its arguments.

    Catch this to restart and resume; the subclasses say whether a peer hung or died.
    """


class CollectiveTimeoutError(CollectiveError):
    """A collective, or the process-group set-up, did not complete within the timeout: a peer hung or never started."""


class PeerLostError(CollectiveError):
    """A peer process's connection closed during a collective: the peer died (crash, kill, out of memory)."""


#: Texts of a peer that is gone (gloo, the c10d store, NCCL-style backends), lower case.
_LOST = (
    "connection closed by peer",  # gloo: the peer exited
    "connection reset by peer",  # gloo: the peer aborted (e.g. gloo's own size check)
    "connection refused",
    "broken pipe",
    "connection was likely closed",  # c10d store: its host died
    "got 0 bytes",
    "remote process exited",  # NCCL-style backends
    "end of file",
)
_EOF = re.compile(r"\beof\b")  # "EOF" as a word, not inside another one
#: Texts of a peer that did not answer in time, lower case.
_TIMEOUT = (
    "timed out",  # gloo: "Timed out waiting 3000ms for recv operation to complete"; store connect
    "timeout",  # gloo after a timeout: "Application timeout caused pair closure"; store: "wait timeout after ..."
    "timing out",  # NCCL/HCCL watchdogs: "... ran for 600000 milliseconds before timing out"
)


def _says_lost(text: str) -> bool:
    return any(marker in text for marker in _LOST) or _EOF.search(text) is not None


def _says_timeout(text: str) -> bool:
    return any(marker in text for marker in _TIMEOUT)


def classify(err: BaseException) -> type[CollectiveError] | None:
    """What a collective's exception means: :class:`CollectiveTimeoutError`, :class:`PeerLostError`, or ``None``.

    ``None`` means the error is not the transport's (a bad argument, mismatched tensors that torch caught, an error of
    the code around the collective): it must reach the user unchanged. A :class:`CollectiveError` is returned as its
    own class.

    Args:
        err: what the collective raised.
    """
    if isinstance(err, CollectiveError):
        return type(err)
    if not isinstance(err, RuntimeError):
        return None
    text = str(err).lower()
    if isinstance(err, dist.DistStoreError):  # the store waited for a key in vain, unless its host is gone
        return PeerLostError if _says_lost(text) else CollectiveTimeoutError
    if isinstance(err, dist.DistNetworkError):  # a socket failed; a connect that timed out is a timeout
        return CollectiveTimeoutError if _says_timeout(text) else PeerLostError
    if _says_timeout(text):
        return CollectiveTimeoutError
    if _says_lost(text):
        return PeerLostError
    return None


def _rank_world() -> tuple[int | str, int | str]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return "?", "?"


def translate_error(err: BaseException, what: str, timeout: timedelta) -> BaseException:
    """The :class:`CollectiveError` to raise for ``err`` from a collective, or ``err`` itself when it is not one.

    Args:
        err: what the collective raised.
        what: the operation, for the message ("barrier", "all_gather", "backward (gradient all-reduce)").
        timeout: the process group's timeout, named in the message.
    """
    kind = classify(err)
    if kind is None or isinstance(err, CollectiveError):
        return err
    rank, world = _rank_world()
    cause = f"Cause: {type(err).__name__}: {err}"
    if kind is CollectiveTimeoutError:
        return CollectiveTimeoutError(
            f"Rank {rank}/{world}: {what} failed: a peer process did not answer within timeout={timeout} (it hangs,"
            f" or is busy elsewhere: a long checkpoint write or graph compilation on one rank).{_RESTART} Raise"
            f" HPUParallelStrategy(timeout=...) if a rank legitimately needs longer. {cause}"
        )
    return PeerLostError(
        f"Rank {rank}/{world}: {what} failed: a peer process died (its connection closed; look in its log for a"
        f" crash, an out-of-memory kill, or gloo's 'Received data size doesn't match expected size', which means the"
        f" ranks passed different shapes or dtypes to the same collective).{_RESTART} The timeout for collectives is"
        f" timeout={timeout}, set by HPUParallelStrategy(timeout=...). {cause}"
    )


class _CollectiveErrors:
    """The context of :func:`collective_errors`: a plain class, so entering and leaving costs well under a µs."""

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
    """A reusable context that raises :func:`translate_error`'s error for a transport failure in the block.

    Other exceptions leave the block unchanged. The context holds no state between uses, so one instance can guard
    every ``backward`` of a run.

    Args:
        what: the operation, for the message.
        timeout: the process group's timeout, named in the message.
    """
    return _CollectiveErrors(what, timeout)
