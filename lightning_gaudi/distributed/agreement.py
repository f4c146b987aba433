"""Agreeing on a step at which every rank stops, without a device sync or a blocking collective per step.

A signal reaches the ranks of a job at different steps (or only one of them), and a checkpoint of a data-parallel job
needs every rank at the same step. :class:`StopVote` runs one small all-reduce (the maximum of each rank's request)
per step on its own gloo process group, on CPU tensors: it is started at the end of step ``k`` and its result read at
the end of step ``k + 1``, by which time it has long finished. Every rank reads the same result after the same number
of steps, so they stop together, one step after the first request. Nothing here imports Lightning.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lightning_gaudi.distributed.errors import collective_errors

__all__ = ["StopVote"]


class StopVote:
    """One vote per step on whether (and why) to stop; the answer arrives one step later, the same on every rank.

    In a single process (no process group, or a group of one) the answer is the request itself, at once.

    Args:
        timeout: how long the vote's process group waits for a peer (the strategy's timeout).
    """

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
        """Casts this rank's ``request`` (0: go on) and returns the vote cast at the previous call (0 the first time).

        The result is the largest request of any rank, the same on all of them. Every rank must call this the same
        number of times. Waiting costs nothing unless a peer is more than a step behind.

        Raises:
            CollectiveTimeoutError: a peer did not vote within the timeout.
            PeerLostError: a peer died.
        """
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
        """Waits for the vote in flight (after the last step, when every rank has cast the same number), then
        :meth:`close`."""
        if self._work is not None:
            with self._errors:
                self._work.wait()
        self.close()

    def close(self) -> None:
        """Forgets the vote in flight and releases the group (after a failure, when a peer may never vote again)."""
        group, work, self._group, self._work = self._group, self._work, None, None
        idle = work is None or work.is_completed()  # a group with a vote in flight is left to the process's exit
        if group is not None and idle and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
