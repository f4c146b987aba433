"""Agreeing on a step at which every rank stops, without a device sync or a blocking collective per step."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lightning_gaudi.distributed.errors import collective_errors

__all__ = ["StopVote"]


class StopVote:
    """A vote every few steps on whether (and why) to stop, answered at the next vote, the same on every rank: an async
    MAX all-reduce of two CPU integers (the request, this rank's time per step) on its own gloo group (``timeout``); in
    a single process, the request itself.

    Votes are ``interval`` steps apart, an interval every rank derives from the slowest rank's step time, so that a
    request reaches every rank within ``latency`` seconds (two intervals) at a cost of one small all-reduce per
    ``interval`` steps (at most :data:`MAX_INTERVAL`).
    """

    #: The most steps between two votes, whatever the step time.
    MAX_INTERVAL = 100

    def __init__(self, timeout: timedelta, latency: float = 2.0) -> None:
        self.timeout = timeout
        self.latency = latency
        self.interval = 1
        self._group: Any = None
        self._work: Any = None
        self._ballot = torch.zeros(2, dtype=torch.int64)  # the request, microseconds per step since the last vote
        self._countdown = self._span = 1  # steps to the next vote, steps between the last two
        self._last_vote: float | None = None
        self._errors = collective_errors("the stop vote (preemption)", timeout)

    @property
    def distributed(self) -> bool:
        """Whether the vote runs between processes (:meth:`setup` found a process group of several)."""
        return self._group is not None

    def setup(self) -> None:
        """Forms the vote's gloo group when a process group of several ranks exists; every rank must call it."""
        self.close()
        self.interval = self._countdown = self._span = 1
        self._last_vote = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            with collective_errors("forming the stop vote's gloo group", self.timeout):
                self._group = dist.new_group(backend="gloo", timeout=self.timeout)

    def step(self, request: int) -> int:
        """Counts a step and, every :attr:`interval` steps, casts ``request`` (0: go on); returns the largest request
        of the previous vote on any rank (0 between votes and at first). Every rank must call this once per step."""
        if self._group is None:
            return request
        self._countdown -= 1
        if self._countdown > 0:
            return 0
        now = time.monotonic()
        result = 0
        if self._work is not None:
            with self._errors:
                self._work.wait()
            result, slowest_us = (int(value) for value in self._ballot.tolist())  # CPU tensors: no device sync
            if slowest_us > 0:  # the same on every rank, so every rank keeps the same interval
                steps = int(self.latency * 1e6 / (2 * slowest_us))
                self.interval = max(1, min(self.MAX_INTERVAL, steps))
        per_step_us = 0 if self._last_vote is None else int((now - self._last_vote) * 1e6 / self._span)
        self._last_vote = now
        self._countdown = self._span = self.interval
        self._ballot[0] = request
        self._ballot[1] = per_step_us
        with self._errors:
            self._work = dist.all_reduce(self._ballot, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return result

    def finish(self) -> None:
        """Waits for the vote in flight, then :meth:`close`."""
        if self._work is not None:
            with self._errors:
                self._work.wait()
        self.close()

    def close(self) -> None:
        """Forgets the vote in flight and releases the group (after a failure)."""
        group, work, self._group, self._work = self._group, self._work, None, None
        idle = work is None or work.is_completed()  # a group with a vote in flight is left to the process's exit
        if group is not None and idle and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
