"""Agreeing on a step at which every rank stops, without a device sync, a collective or a wait in the step."""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lightning_gaudi.distributed.errors import collective_errors

_KEY = "lightning_gaudi/stop"
_POLL_S = (0.001, 0.02)  # first and longest pause between looks at a round that has not ended


class StopVote:
    """A vote in wall time on whether (and why) every rank stops, and after which step: the same answer on every rank.

    A thread on each rank casts a ballot on the job's rendezvous store every ``latency / 2`` seconds: this rank's
    request (0: go on) and the step it commits not to pass before the round ends, a quarter of ``latency`` ahead at its
    recent step rate. When a round holds a request, every rank stops after the largest committed step, so a request
    reaches every rank within ``latency`` however the step time changes. In a single process the request is the answer.
    """

    def __init__(self, timeout: timedelta, latency: float = 2.0) -> None:
        self.timeout = timeout
        self.latency = latency
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._leave = threading.Event()
        self._steps = 0
        self._request = 0
        self._bound: int | None = None  # the step this rank may not pass before the current round ends
        self._outcome: tuple[int, int] | None = None  # (signal, the step after which every rank stops)
        self._error: BaseException | None = None
        self._errors = collective_errors("the stop vote (preemption)", timeout)

    def setup(self, namespace: str) -> None:
        """Starts voting on the job's store (``MASTER_ADDR``/``MASTER_PORT``) under the keys ``namespace`` (the same on
        every rank, fresh for this vote) when a process group of several ranks exists."""
        self.close()
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
        if not host or not port.isdecimal():
            raise RuntimeError(
                f"PreemptionCheckpoint: MASTER_ADDR={host!r}, MASTER_PORT={port!r} do not name the job's rendezvous"
                " store, where the ranks agree when to stop. Set both or pass PreemptionCheckpoint(enabled=False)."
            )
        with collective_errors("connecting the stop vote to the job's store", self.timeout):
            store = dist.TCPStore(host, int(port), None, False, timeout=self.timeout, wait_for_workers=False)
        self.start(store, dist.get_rank(), dist.get_world_size(), f"{_KEY}/{namespace}")

    def start(self, store: dist.Store, rank: int, world_size: int, namespace: str) -> None:
        """Starts voting on ``store`` under the keys ``namespace`` (the same on every rank, fresh for this vote)."""
        self.close()
        self._leave.clear()
        self._steps = self._request = 0
        self._bound = self._outcome = self._error = None
        self._thread = threading.Thread(
            target=self._run, args=(store, rank, world_size, namespace), name="lightning_gaudi-stop-vote", daemon=True
        )
        self._thread.start()

    def step(self, request: int) -> int:
        """Counts a step; ``request`` (0: go on) is cast at the next round. Returns the agreed signal at the step every
        rank stops after (0 before it). Every rank must call this once per step."""
        if self._thread is None:
            return request
        with self._cond:
            self._steps = steps = self._steps + 1
            if request and not self._request:
                self._request = request
            while True:
                if self._error is not None:
                    with self._errors:
                        raise self._error
                if self._outcome is not None:
                    signum, last = self._outcome
                    return signum if steps >= last else 0
                if self._bound is None or steps < self._bound:
                    return 0
                self._cond.wait()  # the round ends once every rank's thread cast its ballot; bounded by the timeout

    def close(self) -> None:
        """Stops voting; the other ranks carry on without this one."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._leave.set()
            thread.join(self.latency / 2 + 5.0)

    def _ahead(self, per_step: float) -> int:
        return 1 if not math.isfinite(per_step) else max(1, math.ceil(self.latency / 4 / per_step))

    def _run(self, store: Any, rank: int, world_size: int, namespace: str) -> None:
        voters = world_size
        then, steps_then = time.monotonic(), 0
        try:
            for number in itertools.count():
                key = f"{namespace}/{number}"
                leaving = self._leave.wait(self.latency / 2)
                with self._cond:
                    steps, request, now = self._steps, self._request, time.monotonic()
                    per_step = (now - then) / (steps - steps_then) if steps > steps_then else math.inf
                    commit = -1 if leaving else steps + self._ahead(per_step)
                    self._bound = None if leaving else commit
                then, steps_then = now, steps
                store.append(key, f"{request}:{commit};")
                if store.add(f"{key}/n", 1) == voters:
                    store.set(f"{key}/end", "1")
                if leaving:
                    return
                self._wait(store, f"{key}/end")
                ballots = [b.split(":") for b in store.get(key).decode().split(";") if b]
                if rank == 0 and number:
                    for name in ("", "/n", "/end"):
                        store.delete_key(f"{namespace}/{number - 1}{name}")
                requests = [int(r) for r, _ in ballots]
                with self._cond:
                    if any(requests):
                        self._outcome = (max(requests), max(int(c) for _, c in ballots))
                    self._bound = None
                    self._cond.notify_all()
                if self._outcome is not None:
                    return
                voters -= sum(int(c) < 0 for _, c in ballots)
        except BaseException as err:  # handed to the training loop at its next step
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _wait(self, store: dist.Store, key: str) -> None:
        deadline = time.monotonic() + self.timeout.total_seconds()
        pause = _POLL_S[0]
        while not store.check([key]):
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"the stop vote's round {key!r} timed out after {self.timeout}")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
