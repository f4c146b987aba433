"""Process-group formation that survives launcher restarts, with bounded waits and errors that say who is missing.

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
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lightning_gaudi.distributed.environment import InvalidLaunchError, LaunchEnvironment
from lightning_gaudi.distributed.errors import CollectiveTimeoutError
from lightning_gaudi.distributed.launcher import free_port

__all__ = [
    "DEFAULT_TIMEOUT",
    "PortInUseError",
    "coerce_timeout",
    "init_process_group",
    "join_generation",
    "probe_store",
    "uses_agent_store",
]

#: The default for ``HPUParallelStrategy(timeout=...)``. See :func:`coerce_timeout`.
DEFAULT_TIMEOUT = timedelta(minutes=10)

_KEY = "lightning_gaudi/pg"
_POLL_S = (0.05, 1.0)  # first and longest pause between looks at the store


def coerce_timeout(timeout: timedelta | float | int | None) -> timedelta:
    """``timeout`` as a positive ``timedelta``; numbers are seconds; ``None`` means :data:`DEFAULT_TIMEOUT`.

    Why 10 minutes rather than PyTorch's 30: the timeout is how long a healthy rank sits in a collective whose peer
    is gone before it fails and lets the launcher restart the job. The longest legitimate waits on Gaudi are rank 0
    writing a large checkpoint while the others wait at the barrier after it, and one rank compiling a new graph
    the others already have; both take minutes, not tens of minutes. Raise it for checkpoints that take longer.

    Raises:
        TypeError: ``timeout`` is neither a ``timedelta`` nor a number.
        ValueError: ``timeout`` is not positive, or not finite (NaN, infinity, more than a ``timedelta`` holds).
    """
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)):
        raise TypeError(
            f"`timeout={timeout!r}` must be a datetime.timedelta or a number of seconds"
            " (e.g. 600 or timedelta(minutes=10))."
        )
    if isinstance(timeout, timedelta):
        value = timeout
    else:
        try:
            value = timedelta(seconds=timeout)
        except (ValueError, OverflowError):  # NaN, infinity, or beyond timedelta's 999999999 days
            raise ValueError(
                f"`timeout={timeout!r}` must be a finite number of seconds (e.g. 600): it bounds how long a collective"
                " waits for its peers; a peer that hangs must end the job some time."
            ) from None
    if value.total_seconds() <= 0:
        raise ValueError(
            f"`timeout={timeout!r}` must be positive (seconds, or a timedelta): it bounds how long a collective waits"
            " for its peers."
        )
    return value


class PortInUseError(InvalidLaunchError):
    """Rank 0 cannot open the rendezvous store: another process already listens on ``MASTER_PORT``."""


def _port_in_use(err: BaseException) -> bool:
    # torch 2.13: DistNetworkError('The server socket has failed to listen on any local network address. port: 29500,
    # useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use')
    text = str(err)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def _port_error(rank: int, addr: str | None, port: int | str | None) -> PortInUseError:
    return PortInUseError(
        f"Rank {rank}: MASTER_PORT={port} on {addr or 'this machine'} is already in use, so the process group's"
        " rendezvous store cannot listen there: another job, or a process left over from an earlier run, holds it."
        f" Pick another port: unset MASTER_PORT so that Lightning chooses a free one, or set one that is free, e.g."
        f" MASTER_PORT={free_port()} (free on this machine now). `ss -ltnp 'sport = :{port}'` shows who holds it."
    )


#: How long a store that accepted the connection may take to answer it (a torch store answers within milliseconds).
STORE_ANSWER_S = 30.0


def _not_a_store_error(rank: int, addr: str, port: int, waited: float) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        f"Rank {rank}: MASTER_PORT={port} on {addr} accepts connections but did not answer as a PyTorch store within"
        f" {waited:.1f}s: another program listens on that port (or a process left over from an earlier run hangs"
        " there), and rank 0 could not open the job's store on it. Pick a free port: unset MASTER_PORT so that"
        f" Lightning chooses one, or set one that is free on {addr}, e.g. MASTER_PORT={free_port()} (free on this"
        f" machine now). `ss -ltnp 'sport = :{port}'` on {addr} shows who holds it."
    )


def probe_store(addr: str, port: int, rank: int, timeout: timedelta) -> None:
    """Checks that a PyTorch store answers at ``addr:port`` before torch connects to it without a bound.

    torch's store client waits for the store's answer to its handshake without a timeout, so a port held by another
    program that accepts connections (and says nothing) would hold a rank forever. The connection is retried until
    ``timeout`` (rank 0 may start later); once something accepts it, the store's answer is awaited for at most
    :data:`STORE_ANSWER_S` seconds (or what is left of ``timeout``).

    Raises:
        CollectiveTimeoutError: nothing accepted within ``timeout``, or what accepted is no PyTorch store.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    pauses = _pauses()
    while True:
        try:
            socket.create_connection((addr, port), timeout=max(min(_remaining(deadline), 5.0), 0.1)).close()
            break
        except OSError:
            if _remaining(deadline) <= 0:
                return  # torch's own connect fails at once now, with the timeout error the caller reports
            time.sleep(min(next(pauses), max(_remaining(deadline), 0)))
    window = max(min(STORE_ANSWER_S, _remaining(deadline)), 1.0)
    answered = threading.Event()
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            dist.TCPStore(addr, port, None, False, timeout=timedelta(seconds=window), wait_for_workers=False)
        except BaseException as err:  # reported by the caller's own connection
            failed.append(err)
        answered.set()

    # a daemon thread: a client stuck in torch's handshake cannot be interrupted, and must not keep the process alive
    threading.Thread(target=connect, name="lightning_gaudi-store-probe", daemon=True).start()
    if not answered.wait(window):
        raise _not_a_store_error(rank, addr, port, window)


def uses_agent_store(launch: LaunchEnvironment | None = None) -> bool:
    """Whether this worker was started by a torchelastic agent whose store outlives it (torchrun's default).

    Args:
        launch: the launch environment; this process's when ``None``.
    """
    return (launch or LaunchEnvironment.from_env()).agent_store


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


def init_process_group(
    backend: str,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    launch: LaunchEnvironment | None = None,
    **kwargs: Any,
) -> None:
    """``torch.distributed.init_process_group`` that waits for late peers (up to ``timeout``) and survives restarts.

    Under a torchelastic agent store each attempt gets a fresh namespace of the agent's store at ``master_addr``/
    ``master_port`` (see :func:`join_generation`). Elsewhere torch's ``env://`` rendezvous runs: rank 0 starts a new
    store and the others retry their connection to it until ``timeout``; it reads ``MASTER_ADDR``/``MASTER_PORT``
    from ``os.environ``, which the strategy (like Lightning's) sets from its cluster environment.

    Args:
        backend: the collective backend ("hccl", "gloo").
        rank: this process's global rank.
        world_size: processes in the group.
        timeout: how long the set-up, and every collective afterwards, waits for peers.
        master_addr: where the agent's store listens; the launch environment's ``MASTER_ADDR`` when ``None``.
        master_port: the store's port; the launch environment's ``MASTER_PORT`` when ``None``.
        launch: the launch environment; this process's (:meth:`LaunchEnvironment.from_env`) when ``None``.
        **kwargs: passed to ``torch.distributed.init_process_group``.

    Raises:
        CollectiveTimeoutError: the group did not form in time; the message says which rank was missing.
        PortInUseError: the store cannot listen on ``MASTER_PORT``: another process holds it (at once, not after
            ``timeout``).
        InvalidLaunchError: the agent store's address is unknown.
    """
    launch = launch or LaunchEnvironment.from_env()
    try:
        if launch.agent_store:
            addr = master_addr or launch.master_addr
            port = master_port or launch.master_port
            if addr is None or port is None:
                raise InvalidLaunchError(
                    f"TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR={addr!r}, MASTER_PORT={port!r}: the agent's"
                    " store cannot be found. Launch with torchrun, which sets all three, or unset"
                    " TORCHELASTIC_USE_AGENT_STORE."
                )
            probe_store(addr, int(port), rank, timeout)
            store = dist.TCPStore(addr, port, world_size, False, timeout=timeout)
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
            env_addr, env_port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
            if rank != 0 and env_addr and env_port.isdigit() and "init_method" not in kwargs:
                probe_store(env_addr, int(env_port), rank, timeout)  # rank 0 opens the store; the others connect
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    except CollectiveTimeoutError:
        raise
    except RuntimeError as err:  # DistError subclasses it; gloo raises plain RuntimeErrors
        if _port_in_use(err):
            addr = master_addr or launch.master_addr or os.environ.get("MASTER_ADDR")
            raise _port_error(rank, addr, master_port or launch.master_port or os.environ.get("MASTER_PORT")) from err
        raise _join_error(rank, world_size, timeout, f"{type(err).__name__}: {err}") from err
    if dist.get_world_size() != world_size:  # pragma: no cover - torch enforces it
        raise RuntimeError(f"Process group has {dist.get_world_size()} ranks, expected {world_size}.")
