"""Process-group formation: the timeout, the restart-proof handshake on an agent's store, and bounded waits."""

from __future__ import annotations

import gc
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from lightning_gaudi.distributed import (
    DEFAULT_TIMEOUT,
    CollectiveTimeoutError,
    InvalidLaunchError,
    LaunchEnvironment,
    PortInUseError,
    coerce_timeout,
    free_port,
    init_process_group,
    join_generation,
    uses_agent_store,
)


def test_coerce_timeout() -> None:
    assert coerce_timeout(None) == DEFAULT_TIMEOUT == timedelta(minutes=10)
    assert coerce_timeout(90) == timedelta(seconds=90)
    assert coerce_timeout(0.5) == timedelta(seconds=0.5)
    assert coerce_timeout(timedelta(seconds=5)) == timedelta(seconds=5)
    with pytest.raises(ValueError, match=r"`timeout=0` must be a positive"):
        coerce_timeout(0)
    with pytest.raises(TypeError, match=r"`timeout='10m'` must be a datetime.timedelta or a number of seconds"):
        coerce_timeout("10m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`timeout=True`"):
        coerce_timeout(True)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"), 1e20])
def test_coerce_timeout_refuses_what_is_not_finite(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"`timeout=.*` must be a positive, finite number of seconds"):
        coerce_timeout(seconds)


@pytest.mark.parametrize("seconds", [-60, -60.0, 0.0])
def test_coerce_timeout_refuses_what_is_not_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"` must be a positive, finite number of seconds \(or a timedelta\)"):
        coerce_timeout(seconds)


def test_uses_agent_store(monkeypatch: pytest.MonkeyPatch) -> None:
    assert uses_agent_store(LaunchEnvironment(agent_store=True))
    assert not uses_agent_store(LaunchEnvironment())
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert uses_agent_store()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert not uses_agent_store()


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    # the joining threads' errors keep the store in reference cycles; on torch 2.7 a store server freed later by the
    # garbage collector, in the middle of the next test's destroy_process_group, hung it
    gc.collect()


def _join(store: dist.TCPStore, rank: int, world: int, timeout: float, out: dict[int, object], delay: float) -> None:
    time.sleep(delay)
    try:
        out[rank] = join_generation(store, rank, world, timedelta(seconds=timeout))
    except Exception as err:
        out[rank] = err


def _run(store: dist.TCPStore, world: int, delays: dict[int, float], timeout: float = 10) -> dict[int, object]:
    out: dict[int, object] = {}
    threads = [threading.Thread(target=_join, args=(store, r, world, timeout, out, d)) for r, d in delays.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def test_restarted_ranks_ignore_what_dead_ones_left_in_the_store(store: dist.TCPStore) -> None:
    first = _run(store, 3, {0: 0.0, 1: 0.0, 2: 0.0})
    assert len(set(first.values())) == 1
    assert isinstance(first[0], str)
    # the next attempt: ranks 1 and 2 start before rank 0, while the dead round's generation and welcomes remain
    second = _run(store, 3, {0: 0.5, 1: 0.0, 2: 0.1})
    assert len(set(second.values())) == 1
    assert isinstance(second[0], str)
    assert second[0] != first[0]


def test_a_rank_that_never_joins_ends_in_a_clear_error(store: dist.TCPStore) -> None:
    started = time.monotonic()
    out = _run(store, 2, {0: 0.0}, timeout=0.5)
    assert time.monotonic() - started < 5
    assert isinstance(out[0], CollectiveTimeoutError)
    assert "did not form within timeout=0:00:00.500000: rank(s) [1] never joined" in str(out[0])
    out = _run(store, 2, {1: 0.0}, timeout=0.5)  # the stale generation of the round above has no live rank 0
    assert isinstance(out[1], CollectiveTimeoutError)
    assert "rank 0 never answered" in str(out[1])


@pytest.fixture
def no_group() -> Iterator[None]:
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_agent_store_needs_an_address(no_group: None) -> None:
    launch = LaunchEnvironment(agent_store=True)
    with pytest.raises(InvalidLaunchError, match=r"TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR=None"):
        init_process_group("gloo", 0, 1, timedelta(seconds=5), launch=launch)


def test_a_group_forms_on_the_agents_store_from_explicit_arguments(store: dist.TCPStore, no_group: None) -> None:
    """The agent's store at an address given as arguments (the environment says nothing about it)."""
    launch = LaunchEnvironment(agent_store=True)
    init_process_group(
        "gloo", 0, 1, timedelta(seconds=10), master_addr="127.0.0.1", master_port=store.port, launch=launch
    )
    assert dist.get_world_size() == 1
    assert store.check(["lightning_gaudi/pg/generation"])  # the handshake ran in the agent's store
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0]


def test_a_missing_peer_ends_the_set_up_within_the_timeout(monkeypatch: pytest.MonkeyPatch, no_group: None) -> None:
    """Rank 1 of 2 whose rank 0 never starts: torch's env:// rendezvous gives up after the timeout, naming it."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"^Rank 1/2: the process group did not form within timeout="):
        init_process_group("gloo", 1, 2, timedelta(seconds=1), launch=LaunchEnvironment())
    assert time.monotonic() - started < 30


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process (here: a socket of this one) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_taken_port_is_named_at_once(monkeypatch: pytest.MonkeyPatch, no_group: None, taken_port: int) -> None:
    """Rank 0 cannot open the rendezvous store on a port that is in use: say so now, not as a timeout later."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(taken_port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    started = time.monotonic()
    with pytest.raises(PortInUseError, match=rf"MASTER_PORT={taken_port} .* is already in use") as caught:
        init_process_group("gloo", 0, 2, timedelta(seconds=20), launch=LaunchEnvironment())
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "unset MASTER_PORT" in message
    assert "MASTER_PORT=" in message.split("already in use", 1)[1]  # a free port to pick
    assert not isinstance(caught.value, CollectiveTimeoutError)
    assert "timeout" not in message


#: Rank 1 of a 2-rank job; prints how long the set-up took, timed after the imports (seconds of a busy machine's
#: interpreter start-up are no part of the timeout).
_RANK_1 = """
import sys, time
from datetime import timedelta
from lightning_gaudi.distributed import LaunchEnvironment, init_process_group
started = time.monotonic()
try:
    init_process_group("gloo", 1, 2, timedelta(seconds=float(sys.argv[1])), launch=LaunchEnvironment())
finally:
    print(f"set-up ended after {time.monotonic() - started:.2f} s", file=sys.stderr)
"""


@pytest.mark.subprocess
def test_a_port_held_by_a_server_that_is_no_store_fails_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch, no_group: None, taken_port: int
) -> None:
    """A 2-rank job whose MASTER_PORT another program listens on: rank 0 cannot open the store (at once), and rank 1,
    which torch would leave waiting for the program's answer without a bound, fails within its timeout, naming the
    port and the fix."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(taken_port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    rank1 = subprocess.run(
        [sys.executable, "-c", _RANK_1, "3"], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    timed = re.findall(r"set-up ended after ([\d.]+) s", rank1.stderr)
    assert timed, rank1.stderr[-4000:]
    took = float(timed[-1])
    with pytest.raises(PortInUseError):
        init_process_group("gloo", 0, 2, timedelta(seconds=3), launch=LaunchEnvironment())
    assert rank1.returncode != 0
    assert "CollectiveTimeoutError" in rank1.stderr
    assert f"MASTER_PORT={taken_port} on 127.0.0.1 accepts connections but did not answer" in rank1.stderr
    assert "unset MASTER_PORT" in rank1.stderr
    assert took < 20, f"rank 1 took {took:.1f}s with a 3 s timeout"
