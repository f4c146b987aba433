"""What the Trainer's HPU strategies (:mod:`lightning_gaudi.strategies`) and Fabric's (:mod:`lightning_gaudi.fabric`)
share.

Lightning has one set of strategy classes per API, with different hooks (``lightning.pytorch.strategies.DDPStrategy``
for the Trainer, ``lightning.fabric.strategies.DDPStrategy`` for Fabric); the HPU classes follow it, and the HPU work
both need lives here once: the checks of the DDP settings and of the launch, the devices' resolution, the process
group on HCCL (gloo in emulation) with its start-up lines, HCCL's reductions, communication hooks, and the release of
the first step's gradients.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.utilities.distributed import ReduceOp
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from lightning_gaudi import hpu
from lightning_gaudi.distributed import check_same_layout, collective_errors, validate_launch
from lightning_gaudi.strategies._common import hpu_device

#: The reductions HCCL has, by name; a mean is a sum divided by the world size.
HCCL_OPS: dict[str, ReduceOp.RedOpType] = {
    "sum": ReduceOp.SUM,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "mean": ReduceOp.AVG,
    "avg": ReduceOp.AVG,
}
#: ``DistributedDataParallel`` arguments the strategies pass themselves.
SET_BY_STRATEGY = ("module", "device_ids")
#: How extra local ranks may start: a forked child cannot take over its parent's HPU.
START_METHODS = ("popen", "spawn")
#: The names the data-parallel HPU strategies register besides their own (with the Trainer's registry and with
#: Fabric's), and the arguments each name implies.
PARALLEL_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("hpu_ddp", {}),  # lightning-habana's name
    ("hpu_parallel_spawn", {"start_method": "spawn"}),
    ("hpu_parallel_find_unused_parameters_true", {"find_unused_parameters": True}),
    ("hpu_parallel_static_graph", {"static_graph": True}),
)


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


def check_bucket_cap_mb(value: Any) -> None:
    """Refuses a ``bucket_cap_mb`` that is not a positive, finite number of megabytes (``None`` is torch's default)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"`bucket_cap_mb={value!r}` must be a positive number of megabytes (Intel suggests 100 to 230 on Gaudi)."
        )


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls).parameters) - {"kwargs"}


def check_ddp_kwargs(kwargs: dict[str, Any], owner: type, base: type) -> None:
    """Refuses what neither ``DistributedDataParallel`` nor Lightning's DDP strategy ``base`` would take, naming the
    likely intended argument, before any process starts.

    Args:
        kwargs: the extra keyword arguments ``owner`` was given.
        owner: the HPU strategy class, whose own arguments are offered as corrections too.
        base: the Lightning DDP strategy ``owner`` builds on (the Trainer's or Fabric's).

    Raises:
        TypeError: an argument both refuse (with the closest name), or one the strategy sets itself.
    """
    ddp = inspect.signature(DistributedDataParallel.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ddp.values()):
        return
    accepted = ((set(ddp) - {"self", "kwargs"}) | _parameters(base)) - set(SET_BY_STRATEGY)
    own = _parameters(owner)
    for name in kwargs:
        if name in SET_BY_STRATEGY:
            raise TypeError(
                f"`{name}` is set by {owner.__name__} itself when it wraps the model in DistributedDataParallel;"
                " remove it."
            )
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted | own), n=1)
            hint = (
                f" Did you mean {close[0]!r}?"
                if close
                else f" DistributedDataParallel takes: {', '.join(sorted(accepted - own))}."
            )
            raise TypeError(
                f"{owner.__name__} got an unexpected keyword argument {name!r}: it is neither one of its own"
                f" arguments nor one of torch.nn.parallel.DistributedDataParallel's.{hint}"
            )


def ddp_arguments(
    owner: type,
    base: type,
    *,
    bucket_cap_mb: float | None,
    broadcast_buffers: bool | None,
    start_method: str,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Checks the DDP settings an HPU parallel strategy was given and returns its extra ``DistributedDataParallel``
    arguments, ``bucket_cap_mb`` and ``broadcast_buffers`` included where given (torch's defaults otherwise).

    Raises:
        TypeError: see :func:`check_ddp_kwargs`.
        ValueError: a bad ``bucket_cap_mb`` or a ``start_method`` other than "popen" and "spawn".
    """
    check_bucket_cap_mb(bucket_cap_mb)
    check_ddp_kwargs(kwargs, owner, base)
    if start_method not in START_METHODS:
        raise ValueError(f"`start_method={start_method!r}` is not supported on HPU; use 'popen' or 'spawn'.")
    arguments = dict(kwargs)
    if bucket_cap_mb is not None:
        arguments["bucket_cap_mb"] = bucket_cap_mb
    if broadcast_buffers is not None:
        arguments["broadcast_buffers"] = broadcast_buffers
    return arguments


def refuse_lazy_emulation(strategy_name: str) -> None:
    """Raises a clear error when data parallelism is asked for under lazy emulation (gloo cannot carry LTC tensors)."""
    backend = hpu.get_backend()
    if backend.is_lazy() and backend.emulated:
        raise ValueError(
            f"{strategy_name!r} cannot run under {hpu.EMULATE_ENV}=lazy: torch's Lazy Tensor Core"
            " tensors cannot cross gloo collectives. Emulate data parallelism with"
            f" {hpu.EMULATE_ENV}=eager, or use one device (strategy 'hpu_single') in lazy emulation."
        )


def check_launch(
    cluster_environment: ClusterEnvironment | None,
    parallel_devices: Sequence[torch.device] | None,
    num_processes: int,
    num_nodes: int,
) -> None:
    """Checks the launcher's variables against ``num_nodes`` x devices and the node's HPUs, once the devices and the
    cluster environment are known (see :meth:`lightning_gaudi.distributed.LaunchEnvironment.validate`).

    Raises:
        InvalidLaunchError: the launch is malformed or disagrees with the requested layout.
    """
    if parallel_devices and cluster_environment is not None:
        validate_launch(
            cluster_environment,
            num_devices=num_processes,
            num_nodes=num_nodes,
            devices_on_node=hpu.get_backend().device_count(),
        )


def check_devices(devices: Sequence[torch.device] | None, owner: str) -> None:
    """Raises the error of :func:`~lightning_gaudi.strategies._common.hpu_device` for a device that is no HPU."""
    for device in devices or ():
        hpu_device(device, owner)


class DeviceResolver:
    """The backend's device for each device a strategy was given (see
    :func:`~lightning_gaudi.strategies._common.hpu_device`), resolved once: ``root_device`` is read for every batch. In
    emulation an ``"hpu"`` device means the emulated one; ``None`` is the card this process drives.

    Args:
        owner: the strategy's name, for errors.
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._resolved: dict[torch.device | str | int | None, torch.device] = {}

    def __call__(self, device: torch.device | str | int | None) -> torch.device:
        resolved = self._resolved.get(device)
        if resolved is None:
            resolved = self._resolved[device] = hpu_device(device, self._owner)
        return resolved


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


def register_comm_hook(
    model: DistributedDataParallel,
    state: object | None,
    hook: Callable[..., Any] | None,
    wrapper: Callable[..., Any] | None,
) -> None:
    """Registers a DDP communication hook on the HPU (Lightning's Trainer registers them on CUDA only)."""
    if hook is not None:
        model.register_comm_hook(state, hook if wrapper is None else wrapper(hook))


class FirstGradientsRelease:
    """Releases the gradients of the first optimizer step under ``gradient_as_bucket_view``.

    DDP rebuilds its buckets in the second step; gradients that still view the first step's buckets would keep them
    alive beside the new ones, a whole extra gradient copy at the peak. Releasing them once avoids that.
    """

    def __init__(self) -> None:
        self._pending = False

    def arm(self, ddp_kwargs: dict[str, Any]) -> None:
        """Call when the model is wrapped in ``DistributedDataParallel``."""
        self._pending = bool(ddp_kwargs.get("gradient_as_bucket_view"))

    def after_step(self, optimizer: Optimizer) -> None:
        """Call after every optimizer step; acts once."""
        if self._pending:
            self._pending = False
            optimizer.zero_grad(set_to_none=True)
