"""Process-group formation that survives launcher restarts, with bounded waits and errors that say who is missing."""

from __future__ import annotations

import contextlib
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

#: The default for ``HPUParallelStrategy(timeout=...)`` (:func:`coerce_timeout`).
DEFAULT_TIMEOUT = timedelta(minutes=10)

_KEY = "lightning_gaudi/pg"
_POLL_S = (0.05, 1.0)  # first and longest pause between looks at the store


def coerce_timeout(timeout: timedelta | float | int | None) -> timedelta:
    """``timeout`` as a positive ``timedelta``; numbers are seconds; ``None`` means :data:`DEFAULT_TIMEOUT` (10 min,
    not PyTorch's 30: a dead peer should end the job soon; raise it for checkpoints that take longer)."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)):
        raise TypeError(f"`timeout={timeout!r}` must be a datetime.timedelta or a number of seconds (e.g. 600).")
    try:
        value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    except (ValueError, OverflowError):  # NaN, infinity, or beyond timedelta's 999999999 days
        value = timedelta(0)
    if value.total_seconds() <= 0:
        raise ValueError(
            f"`timeout={timeout!r}` must be a positive, finite number of seconds (or a timedelta), e.g. 600: it bounds"
            " how long a collective waits for its peers."
        )
    return value


class PortInUseError(InvalidLaunchError):
    """Rank 0 cannot open the rendezvous store: another process already listens on ``MASTER_PORT``."""


def _port_in_use(err: BaseException) -> bool:
    text = str(err)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def _pick_another(port: int | str | None, addr: str) -> str:
    return (
        "another job, or a process left over from an earlier run, holds it. Pick another port: unset MASTER_PORT so"
        f" that Lightning picks one, or set a free one (e.g. MASTER_PORT={free_port()}, free on this machine now);"
        f" `ss -ltnp 'sport = :{port}'` on {addr} shows who holds it."
    )


#: How long a store that accepted the connection may take to answer it (a torch store answers within milliseconds).
STORE_ANSWER_S = 30.0


def probe_store(addr: str, port: int, rank: int, timeout: timedelta) -> None:
    """Raises :class:`CollectiveTimeoutError` when what listens at ``addr:port`` is no PyTorch store (torch's client
    would wait for its handshake forever)."""
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

    def connect() -> None:
        with contextlib.suppress(BaseException):  # an error is the caller's own connection's to report
            dist.TCPStore(addr, port, None, False, timeout=timedelta(seconds=window), wait_for_workers=False)
        answered.set()

    # a daemon thread: a client stuck in torch's handshake cannot be interrupted, and must not keep the process alive
    threading.Thread(target=connect, name="lightning_gaudi-store-probe", daemon=True).start()
    if not answered.wait(window):
        raise CollectiveTimeoutError(
            f"Rank {rank}: MASTER_PORT={port} on {addr} accepts connections but did not answer as a PyTorch store"
            f" within {window:.1f}s: {_pick_another(port, addr)}"
        )


def uses_agent_store(launch: LaunchEnvironment | None = None) -> bool:
    """Whether a torchelastic agent whose store outlives this worker started it (``launch``: this process's)."""
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
    """Agrees on a fresh namespace of ``store`` with every live rank and returns its prefix (a rank accepts rank 0's
    generation once rank 0 echoes the rank's token, so a dead process's values are never used)."""
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
    """``torch.distributed.init_process_group`` that waits for late peers (up to ``timeout``) and survives restarts
    (:func:`join_generation` on torchrun's agent store); raises :class:`CollectiveTimeoutError` or
    :class:`PortInUseError`."""
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
            kwargs["store"] = dist.PrefixStore(prefix, store)
        else:
            env_addr, env_port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
            if rank != 0 and env_addr and env_port.isdigit() and "init_method" not in kwargs:
                probe_store(env_addr, int(env_port), rank, timeout)  # rank 0 opens the store; the others connect
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    except CollectiveTimeoutError:
        raise
    except RuntimeError as err:  # DistError subclasses it; gloo raises plain RuntimeErrors
        if _port_in_use(err):
            addr = master_addr or launch.master_addr or os.environ.get("MASTER_ADDR") or "this machine"
            held = master_port or launch.master_port or os.environ.get("MASTER_PORT")
            raise PortInUseError(
                f"Rank {rank}: MASTER_PORT={held} on {addr} is already in use, so the rendezvous store cannot listen"
                f" there: {_pick_another(held, addr)}"
            ) from err
        raise _join_error(rank, world_size, timeout, f"{type(err).__name__}: {err}") from err
