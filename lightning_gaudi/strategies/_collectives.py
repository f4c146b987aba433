"""HCCL's collectives for the HPU strategies: the reductions HCCL has, and the process group with its start-up lines."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.utilities.distributed import ReduceOp
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.distributed import check_same_layout, collective_errors

#: The reductions HCCL has, by name; a mean is a sum divided by the world size.
HCCL_OPS: dict[str, ReduceOp.RedOpType] = {
    "sum": ReduceOp.SUM,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "mean": ReduceOp.AVG,
    "avg": ReduceOp.AVG,
}


def as_reduce_op(reduce_op: ReduceOp | str | None) -> ReduceOp.RedOpType:
    """The HCCL reduction ``reduce_op`` names (``None`` is the mean).

    Raises:
        ValueError: ``reduce_op`` is no reduction, or one HCCL lacks (a product, bitwise ones).
    """
    if reduce_op is None:
        return ReduceOp.AVG
    if isinstance(reduce_op, str):
        op = HCCL_OPS.get(reduce_op.lower())
        if op is not None:
            return op
        if not isinstance(getattr(ReduceOp, reduce_op.upper(), None), ReduceOp.RedOpType):
            raise ValueError(
                f"`reduce_op={reduce_op!r}` is not a reduction; use 'mean', 'sum', 'min', 'max' or a ReduceOp."
            )
    else:
        # a ReduceOp object equals its RedOpType but does not hash like it
        op = next((known for known in HCCL_OPS.values() if reduce_op == known), None)
        if op is not None:
            return op
    raise ValueError(
        f"`reduce_op={reduce_op!r}` is not supported on HPU: HCCL reduces with sum, min, max (and mean, as a sum"
        " divided by the world size), in emulation as on a Gaudi. Use 'sum', 'mean', 'min' or 'max'; for a product,"
        " all_gather the values and multiply them."
    )


class DistributedStrategy(Protocol):
    """What :func:`form_process_group` reads of an HPU strategy (the Trainer's or Fabric's): its ranks, where the main
    process listens, the timeout and the device."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def node_rank(self) -> int: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def cluster_environment(self) -> ClusterEnvironment | None: ...

    @property
    def timeout(self) -> timedelta: ...

    @property
    def root_device(self) -> torch.device: ...


def form_process_group(
    strategy: DistributedStrategy, process_group_backend: str, log: logging.Logger, init: Callable[..., None]
) -> None:
    """Prepares the HPU's collectives (``initialize_distributed_hpu`` on a Gaudi) and forms ``strategy``'s process
    group, unless one exists, logging Lightning-style start-up lines (each rank's, then rank zero's summary) on ``log``.

    Args:
        strategy: the strategy, its ranks already set.
        process_group_backend: "hccl" on a Gaudi, "gloo" in emulation, or the user's choice.
        log: a logger under Lightning's (``lightning.pytorch`` or ``lightning.fabric``), so its handler applies.
        init: :func:`lightning_gaudi.distributed.init_process_group` (the caller's reference to it).
    """
    cluster_environment = strategy.cluster_environment
    assert cluster_environment is not None
    global_rank, world_size = strategy.global_rank, strategy.world_size
    backend = hpu.get_backend()
    backend.init_distributed(world_size, global_rank, strategy.local_rank)
    if dist.is_initialized():
        return
    # torch's env:// rendezvous reads these (as in Lightning's DDP strategies); the agent-store path takes them as
    # arguments
    os.environ["MASTER_ADDR"] = cluster_environment.main_address
    os.environ["MASTER_PORT"] = str(cluster_environment.main_port)
    emulated = f" emulated on the CPU ({backend.name} mode)" if backend.emulated else ""
    log.info(
        f"Initializing distributed: GLOBAL_RANK: {global_rank}, MEMBER: {global_rank + 1}/"
        f"{world_size} on HPU {strategy.local_rank} of node {strategy.node_rank}"
        f" ({backend.device_name()}{emulated}, device {strategy.root_device})"
    )
    init(
        process_group_backend,
        rank=global_rank,
        world_size=world_size,
        timeout=strategy.timeout,
        master_addr=cluster_environment.main_address,
        master_port=cluster_environment.main_port,
    )
    if global_rank == 0:
        stand_in = f", {process_group_backend} standing in for HCCL" if backend.emulated else ""
        log.info(
            f"{'-' * 100}\n"
            f"distributed_backend={process_group_backend}\n"
            f"All distributed processes registered. Starting with {world_size} processes\n"
            f"HPUs: {strategy.num_processes} per node x {strategy.num_nodes} node(s), {backend.device_name()}{emulated}"
            f"{stand_in}\n"
            f"{'-' * 100}\n"
        )


def all_reduce(tensor: Tensor | Any, group: Any | None, reduce_op: ReduceOp | str | None, timeout: timedelta) -> Any:
    """All-reduces ``tensor`` with what HCCL has: a mean is a sum divided by the world size, in floating point.

    A tensor of more than one element is first checked to have the same shape and dtype on every rank (gloo would
    abort a rank over a mismatch). Anything but a tensor, and any tensor outside a process group, is returned as is.

    Raises:
        CollectiveMismatchError: the ranks passed different shapes or dtypes (on every rank, naming each one's).
        ValueError: ``reduce_op`` is not a reduction HCCL has, also in emulation and in a single process.
    """
    if not isinstance(tensor, Tensor):
        return tensor
    op = as_reduce_op(reduce_op)
    if not dist.is_available() or not dist.is_initialized():
        return tensor
    mean = op == ReduceOp.AVG
    if mean:
        op = ReduceOp.SUM
    result = tensor if tensor.is_floating_point() else tensor.float()
    with collective_errors("all_reduce", timeout):
        # not for scalars, what logging with sync_dist reduces every step: the check is one more collective, and
        # ranks logging the same quantity log it in the same dtype
        if result.numel() != 1:
            check_same_layout(result, "all_reduce", group)
        dist.all_reduce(result, op=op, group=group)
    if mean:
        result = result / dist.get_world_size(group)
    return result
