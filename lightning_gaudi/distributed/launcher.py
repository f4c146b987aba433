"""Starts one node's rank processes, one per card, and stops the others when one fails."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping

from lightning_gaudi.distributed.environment import InvalidLaunchError, read_int, read_master_port

log = logging.getLogger(__name__)

_POLL_S = 0.2
_TERM_GRACE_S = 30.0  # how long a stopped rank may take to exit on SIGTERM before it is killed


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now (the operating system's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_local_ranks(
    command: list[str], nprocs: int, num_nodes: int = 1, env: Mapping[str, str] | None = None
) -> list[int]:
    """Runs ``command`` once per local rank with ``env`` (default ``os.environ``) and the rank variables (default
    address: localhost, a free port, node rank 0); returns their exit codes."""
    if not command:
        raise InvalidLaunchError("launch_local_ranks needs a command to run, e.g. [sys.executable, 'train.py'].")
    if nprocs < 1 or num_nodes < 1:
        raise InvalidLaunchError(
            f"nprocs={nprocs} and num_nodes={num_nodes} must both be at least 1 (processes per node, nodes)."
        )
    base = dict(os.environ if env is None else env)
    if num_nodes > 1 and not {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK"} <= base.keys():
        raise InvalidLaunchError(
            f"trainer.num_nodes={num_nodes} without a cluster launcher: set MASTER_ADDR, MASTER_PORT and NODE_RANK on"
            " every node, or launch with torchrun or SLURM."
        )
    base.setdefault("MASTER_ADDR", "127.0.0.1")
    base.setdefault("MASTER_PORT", str(free_port()))
    base.setdefault("NODE_RANK", "0")
    base["WORLD_SIZE"] = str(nprocs * num_nodes)
    read_master_port(base)  # malformed values fail here, once
    if (node_rank := read_int(base, "NODE_RANK")) is not None and node_rank >= num_nodes:
        raise InvalidLaunchError(
            f"NODE_RANK={node_rank} is out of range for num_nodes={num_nodes}. Give each node its own NODE_RANK."
        )
    log.info("lightning_gaudi: starting %d rank process(es): %s", nprocs, " ".join(command))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(nprocs):
            procs.append(subprocess.Popen(command, env={**base, "LOCAL_RANK": str(rank)}))
    except BaseException:
        _stop(procs, signal.SIGKILL)
        raise
    return wait_all(procs)


def _stop(procs: list[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)


def wait_all(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Waits for ``procs`` and returns their exit codes; when one fails, terminates the rest. ``SIGTERM``/``SIGHUP`` is
    passed on to the ranks, then ends this process; a rank alive 30 s later is killed."""
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not received:
            received.append(signum)
            _stop(procs, signal.Signals(signum))

    # Python delivers signals to the main thread only; elsewhere the caller's own handling applies
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        codes = _wait(procs, received)
    except BaseException:  # interrupted (Ctrl-C): no rank may outlive the launcher
        _stop(procs, signal.SIGKILL)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        os.kill(os.getpid(), received[0])  # the default action now: end as the signal asked
    return codes


def _wait(procs: list[subprocess.Popen[bytes]], received: list[int]) -> list[int]:
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes if c is not None]
        if received and deadline is None:
            deadline = time.monotonic() + _TERM_GRACE_S
        if any(c not in (None, 0) for c in codes) and deadline is None:
            _stop(procs, signal.SIGTERM)
            deadline = time.monotonic() + _TERM_GRACE_S
        if deadline is not None and time.monotonic() >= deadline:
            _stop(procs, signal.SIGKILL)
            return [p.wait() for p in procs]
        time.sleep(_POLL_S)
