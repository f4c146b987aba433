"""Agreeing on a step at which every rank stops, without a device sync or a blocking collective per step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lightning_gaudi.distributed.errors import collective_errors

__all__ = ["StopVote"]


class StopVote:
    """One vote per step on whether (and why) to stop, answered one step later, the same on every rank: an async MAX
    all-reduce of a CPU integer on its own gloo group (``timeout``); in a single process, the request itself."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout
        self._group: Any = None
        self._work: Any = None
        self._ballot = torch.zeros(1, dtype=torch.int32)
        self._errors = collective_errors("the stop vote (preemption)", timeout)

    @property
    def distributed(self) -> bool:
        """Whether the vote runs between processes (:meth:`setup` found a process group of several)."""
        return self._group is not None

    def setup(self) -> None:
        """Forms the vote's gloo group when a process group of several ranks exists; every rank must call it."""
        self.close()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            with collective_errors("forming the stop vote's gloo group", self.timeout):
                self._group = dist.new_group(backend="gloo", timeout=self.timeout)

    def step(self, request: int) -> int:
        """Casts ``request`` (0: go on); returns the largest request of the previous call on any rank (0 at first).
        Every rank must call this equally often."""
        if self._group is None:
            return request
        result = 0
        if self._work is not None:
            with self._errors:
                self._work.wait()
            result = int(self._ballot.item())  # a CPU tensor: no device sync
        self._ballot.fill_(request)
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
