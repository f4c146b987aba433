"""Real faults between 2 gloo processes on 127.0.0.1, classified as the strategy would report them.

Each test starts ``tests/reliability_helpers/collective_faults.py`` twice and reads what each rank recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_gaudi.distributed import CollectiveTimeoutError, PeerLostError, classify, free_port

WORKER = Path(__file__).parents[1] / "reliability_helpers" / "collective_faults.py"


def _run_pair(scenario: str, out: Path) -> tuple[list[int], list[list[dict[str, Any]]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "LIGHTNING_GAUDI_"))}
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", LIGHTNING_GAUDI_EMULATE="eager")
    out.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(rank), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    events = []
    for rank in range(2):
        path = out / f"rank{rank}.jsonl"
        events.append([json.loads(line) for line in path.read_text().splitlines()] if path.exists() else [])
    return [proc.returncode for proc in procs], events, "\n".join(logs)


def _error(event: dict[str, Any]) -> RuntimeError:
    """The recorded error, rebuilt as the plain RuntimeError gloo raised (the tests below check that it was one)."""
    assert event["outcome"] == "error", event
    assert event["bases"][:2] == ["RuntimeError", "Exception"], event  # gloo uses no DistError subclass here
    return RuntimeError(event["message"])


@pytest.mark.subprocess
def test_what_gloo_raises_for_an_exited_and_a_hung_peer(tmp_path: Path) -> None:
    """A peer that sleeps past 2 s: a timeout, then every later collective fails with "Application timeout caused pair
    closure" (still a timeout). Then, in a new group of the same processes, a peer that exits: "Connection closed by
    peer" (lost)."""
    codes, events, log = _run_pair("raw-hang-exit", tmp_path)
    assert codes == [0, 1], log
    first, again, reduce = events[0]
    assert "Timed out waiting 2000ms for recv operation to complete" in first["message"], first
    assert again["message"] == "Application timeout caused pair closure", again
    assert classify(_error(first)) is CollectiveTimeoutError
    assert classify(_error(again)) is CollectiveTimeoutError
    assert "Connection closed by peer" in reduce["message"], reduce
    assert classify(_error(reduce)) is PeerLostError


@pytest.mark.subprocess
def test_gloo_aborts_a_rank_on_a_shape_mismatch(tmp_path: Path) -> None:
    """Why the strategy checks layouts itself: gloo raises nothing useful. The rank that receives more bytes than
    it expects is aborted in C++; its peer returns wrong data or sees the connection reset (a peer that did die)."""
    codes, events, log = _run_pair("raw-mismatch", tmp_path)
    assert codes[0] == -signal.SIGABRT, log
    assert "gloo::EnforceNotMet" in log, log
    # the failed check, in the wording of the gloo in torch 2.13 and in that of torch 2.7.1 ("... 6 vs 4")
    assert "Received data size doesn't match expected size" in log or "op.preamble.length <= op.nbytes" in log, log
    assert events[0] == []  # rank 0 never returned from all_gather
    [gather] = events[1]
    if gather["outcome"] == "error":
        assert "Connection reset by peer" in gather["message"], gather
        assert classify(_error(gather)) is PeerLostError
    else:  # rank 1 finished reading before rank 0 died: 3 elements of its own buffer size, silently wrong
        assert len(gather["result"]) == 6


@pytest.mark.subprocess
def test_the_strategy_reports_a_mismatch_to_the_user_and_an_exited_peer_as_lost(tmp_path: Path) -> None:
    codes, events, log = _run_pair("strategy", tmp_path)
    assert codes == [0, 1], log
    for rank in range(2):
        mismatch, reduce_mismatch, good = events[rank][:3]
        for event, what in ((mismatch, "all_gather"), (reduce_mismatch, "all_reduce")):
            assert event["type"] == "CollectiveMismatchError", event
            assert "ValueError" in event["bases"]
            assert "CollectiveError" not in event["bases"]  # not a dead or hung peer
            assert event["message"].startswith(f"{what} needs a tensor of the same shape and dtype on every rank")
        assert (
            "rank 0: shape (2,) (2 elements) float32; rank 1: shape (3,) (3 elements) float32" in (mismatch["message"])
        )
        assert "rank 0: shape (2, 2) (4 elements) float32; rank 1: shape (2, 3)" in reduce_mismatch["message"]
        assert good == {"step": "all_gather", "outcome": "ok", "result": [[0.0, 0.0], [1.0, 1.0]]}  # still usable
    [barrier] = events[0][3:]
    assert barrier["type"] == "PeerLostError", barrier
    assert barrier["message"].startswith("Rank 0/2: barrier 'after exit' failed: a peer process died"), barrier
    assert "Cause: RuntimeError: [" in barrier["message"]
    assert "Connection closed by peer" in barrier["message"]
    assert "timeout=0:00:20" in barrier["message"]
    assert len(events[1]) == 3  # rank 1 exited after the good all_gather
