"""Process-group set-up that survives launcher restarts, bounded waits, and errors that say what happened.

Under ``torchrun`` the workers share the node agents' rendezvous ``TCPStore`` (``TORCHELASTIC_USE_AGENT_STORE``),
and that store outlives the workers: after a restart it still holds the addresses the dead workers published.
``init_process_group`` on it lets a restarted worker read a dead peer's address and fail ("Connection refused",
or a gloo connect that hangs), depending on who starts first. :func:`init_process_group` therefore puts every
attempt in a fresh namespace of the store: rank 0 publishes a new random ``generation`` and each other rank joins
it only after rank 0 has answered a token that rank created itself, so a value left by a dead process can never be
taken for a live one. Peers that start late are waited for up to ``timeout``; then the error names who is missing.
(The connection step after the handshake has its own ``timeout``; every collective afterwards gets the full one.)
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch.distributed as dist

#: The default for ``HPUParallelStrategy(timeout=...)``. See :func:`coerce_timeout`.
DEFAULT_TIMEOUT = timedelta(minutes=10)

_KEY = "lightning_gaudi/pg"
_POLL_S = (0.05, 1.0)  # first and longest pause between looks at the store


class CollectiveTimeoutError(RuntimeError):
    """A collective or the process-group set-up did not complete: a peer died, hung or never started."""


def coerce_timeout(timeout: timedelta | float | int | None) -> timedelta:
    """``timeout`` as a positive ``timedelta``; numbers are seconds; ``None`` means :data:`DEFAULT_TIMEOUT`.

    Why 10 minutes rather than PyTorch's 30: the timeout is how long a healthy rank sits in a collective whose peer
    is gone before it fails and lets the launcher restart the job. The longest legitimate waits on Gaudi are rank 0
    writing a large checkpoint while the others wait at the barrier after it, and one rank compiling a new graph
    the others already have; both take minutes, not tens of minutes. Raise it for checkpoints that take longer.
    """
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)):
        raise TypeError(
            f"`timeout={timeout!r}` must be a datetime.timedelta or a number of seconds"
            " (e.g. 600 or timedelta(minutes=10))."
        )
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if value.total_seconds() <= 0:
        raise ValueError(
            f"`timeout={timeout!r}` must be positive: it bounds how long a collective waits for its peers."
        )
    return value


def uses_agent_store() -> bool:
    """Whether this worker was started by a torchelastic agent whose store outlives it (torchrun's default)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def _pauses() -> Iterator[float]:
    pause = _POLL_S[0]
    while True:
        yield pause
        pause = min(pause * 2, _POLL_S[1])


def _join_error(rank: int, world_size: int, timeout: timedelta, detail: str) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        f"Rank {rank}/{world_size}: the process group did not form within timeout={timeout}: {detail}."
        " Check that every node was launched with the same --nnodes/--nproc-per-node (or num_nodes/devices) and can"
        " reach MASTER_ADDR; raise HPUParallelStrategy(timeout=...) if nodes start further apart than that."
    )


def join_generation(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> str:
    """Agrees on a fresh namespace of ``store`` with every live rank; returns its key prefix.

    Rank 0 publishes a new generation and waits for each rank's hello; a rank answers the generation it reads with a
    token of its own and accepts it only when rank 0 echoes that token back, so stale values from a dead process are
    never used. Waits at most ``timeout``.

    Raises:
        CollectiveTimeoutError: a rank did not join (on rank 0), or no live rank 0 answered (elsewhere), in time.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    pauses = _pauses()
    if rank == 0:
        generation = uuid.uuid4().hex
        store.set(f"{_KEY}/generation", generation)
        missing = list(range(1, world_size))
        while missing:
            for peer in list(missing):
                hello = f"{_KEY}/{generation}/hello/{peer}"
                if store.check([hello]):
                    store.set(f"{_KEY}/{generation}/welcome/{peer}", store.get(hello).decode())
                    missing.remove(peer)
            if missing:
                if _remaining(deadline) <= 0:
                    raise _join_error(rank, world_size, timeout, f"rank(s) {missing} never joined")
                time.sleep(min(next(pauses), max(_remaining(deadline), 0)))
        return f"{_KEY}/{generation}"
    token = uuid.uuid4().hex
    while True:
        if store.check([f"{_KEY}/generation"]):
            generation = store.get(f"{_KEY}/generation").decode()
            store.set(f"{_KEY}/{generation}/hello/{rank}", token)
            welcome = f"{_KEY}/{generation}/welcome/{rank}"
            if store.check([welcome]) and store.get(welcome).decode() == token:
                return f"{_KEY}/{generation}"
        if _remaining(deadline) <= 0:
            raise _join_error(rank, world_size, timeout, "rank 0 never answered")
        time.sleep(min(next(pauses), max(_remaining(deadline), 0)))


def init_process_group(backend: str, rank: int, world_size: int, timeout: timedelta, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` that waits for late peers (up to ``timeout``) and survives restarts.

    Expects ``MASTER_ADDR``/``MASTER_PORT`` in the environment. Under a torchelastic agent store each attempt gets a
    fresh namespace (see :func:`join_generation`); elsewhere rank 0 starts a new store and the others retry their
    connection to it until ``timeout``.

    Raises:
        CollectiveTimeoutError: the group did not form in time; the message says which rank was missing.
    """
    try:
        if uses_agent_store():
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, False, timeout=timeout
            )
            prefix = join_generation(store, rank, world_size, timeout)
            dist.init_process_group(
                backend,
                store=dist.PrefixStore(prefix, store),
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                **kwargs,
            )
        else:
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    except CollectiveTimeoutError:
        raise
    except RuntimeError as err:  # DistError subclasses it; gloo raises plain RuntimeErrors
        raise _join_error(rank, world_size, timeout, f"{type(err).__name__}: {err}") from err
    if dist.get_world_size() != world_size:  # pragma: no cover - torch enforces it
        raise RuntimeError(f"Process group has {dist.get_world_size()} ranks, expected {world_size}.")


def translate_error(err: RuntimeError, what: str, timeout: timedelta, transport_only: bool = False) -> RuntimeError:
    """The :class:`CollectiveTimeoutError` to raise for ``err`` from a collective, or ``err`` itself.

    Args:
        err: what the collective raised.
        what: the operation, for the message ("barrier", "all_gather", "backward (gradient all-reduce)").
        timeout: the configured timeout, named in the message.
        transport_only: translate only errors from the collective transport (for code such as ``backward`` that can
            also fail for reasons of its own).
    """
    if isinstance(err, CollectiveTimeoutError) or (transport_only and not _is_transport_error(err)):
        return err
    rank = dist.get_rank() if dist.is_initialized() else "?"
    world = dist.get_world_size() if dist.is_initialized() else "?"
    return CollectiveTimeoutError(
        f"Rank {rank}/{world}: {what} failed: a peer process died or did not answer within timeout={timeout}."
        " Restart the job (torchrun --max-restarts N, SLURM --requeue) and resume with"
        " ckpt_path=lightning_gaudi.resume.resolve_ckpt_path('auto', <checkpoint dir>). The timeout is set by"
        f" HPUParallelStrategy(timeout=...). Cause: {type(err).__name__}: {err}"
    )


class _CollectiveErrors:
    __slots__ = ("timeout", "transport_only", "what")

    def __init__(self, what: str, timeout: timedelta, transport_only: bool) -> None:
        self.what = what
        self.timeout = timeout
        self.transport_only = transport_only

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, RuntimeError):
            translated = translate_error(exc, self.what, self.timeout, self.transport_only)
            if translated is not exc:
                raise translated from exc


def collective_errors(what: str, timeout: timedelta, transport_only: bool = False) -> AbstractContextManager[None]:
    """A context that raises :func:`translate_error`'s error for a ``RuntimeError`` in the block (same arguments).

    A plain class rather than a generator: entering and leaving it costs well under a microsecond, so it can guard
    the gradient all-reduce in every ``backward``.
    """
    return _CollectiveErrors(what, timeout, transport_only)


_TRANSPORT_MARKERS = ("gloo", "hccl", "connection", "timed out", "timeout", "socket", "peer")


def _is_transport_error(err: RuntimeError) -> bool:
    if isinstance(err, dist.DistError):
        return True
    text = str(err).lower()
    return any(marker in text for marker in _TRANSPORT_MARKERS)
