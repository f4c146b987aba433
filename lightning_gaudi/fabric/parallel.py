"""Fabric's ``"hpu_parallel"`` strategy: DistributedDataParallel over HCCL (gloo in emulation)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment, Precision
from lightning.fabric.strategies import DDPStrategy, Strategy
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.seed import reset_seed
from lightning.fabric.utilities.types import Optimizable
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.distributed import (
    DEFAULT_TIMEOUT,
    check_same_layout,
    coerce_timeout,
    collective_errors,
    init_process_group,
)
from lightning_gaudi.fabric._base import HPUStrategyMixin
from lightning_gaudi.strategies._shared import (
    PARALLEL_VARIANTS,
    DeviceResolver,
    FirstGradientsRelease,
    all_reduce,
    check_devices,
    check_launch,
    ddp_arguments,
    form_process_group,
    refuse_lazy_emulation,
    register_comm_hook,
)

# Fabric's handler and level apply to it, so the start-up lines appear where Fabric's own DDP lines would
_log = logging.getLogger("lightning.fabric.strategies.hpu_parallel")


class HPUParallelStrategy(HPUStrategyMixin, DDPStrategy):
    """Data-parallel Fabric loops on several HPUs, one process per card, with ``DistributedDataParallel``:
    ``Fabric(accelerator="hpu", strategy="hpu_parallel", devices=8)``.

    The Fabric counterpart of :class:`lightning_gaudi.HPUParallelStrategy` (the Trainer's), with the same settings
    and behaviour: HCCL on a Gaudi (Intel's bridge registers it and ``initialize_distributed_hpu`` maps the launcher's
    variables), gloo in emulation; the launch checked against ``num_nodes`` x ``devices`` while Fabric is built,
    before any process starts; collectives that fail with a clear error when a peer hangs or dies; HCCL's reductions
    only (a mean is a sum divided by the world size). In lazy mode it cuts the graph after each ``fabric.backward``
    and each optimizer step. With ``accelerator="hpu"``, Fabric's own DDP names (``"ddp"``, ``"ddp_spawn"``,
    ``"ddp_find_unused_parameters_true"``) run this strategy with the same settings.

    Args:
        accelerator: normally left to Fabric (``accelerator="hpu"``).
        parallel_devices: normally left to Fabric (``devices=...``); in emulation ``torch.device("hpu")`` means the
            emulated device.
        cluster_environment: how ranks find each other; detected by Lightning when not given.
        checkpoint_io: defaults to :class:`~lightning_gaudi.checkpoint_io.HPUCheckpointIO` (CPU tensors, atomic), what
            ``fabric.save`` writes with.
        precision: e.g. :class:`~lightning_gaudi.fabric.HPUPrecision`; normally ``Fabric(precision=...)``.
        bucket_cap_mb: DDP gradient bucket size in MB (torch's default 25 when ``None``); Intel reports 100 MB best for
            ResNet50 and 200 MB for ResNeXt101.
        gradient_as_bucket_view: let gradients be views into the all-reduce buckets, saving one gradient copy (Intel's
            advice on Gaudi, hence the default ``True``); the first step's gradients are then released right after
            it, so DDP's bucket rebuild never holds two gradient copies.
        static_graph: tell DDP the set of used parameters and the graph never change between iterations.
        find_unused_parameters: search the autograd graph for parameters without gradients each step.
        broadcast_buffers: broadcast module buffers from rank 0 at each forward; ``None`` leaves torch's default.
        process_group_backend: override the collective backend ("hccl" on Gaudi, "gloo" in emulation).
        timeout: how long a collective, a barrier or the process-group set-up waits for its peers before it fails
            with a :class:`~lightning_gaudi.distributed.CollectiveTimeoutError`; a ``timedelta`` or seconds.
        start_method: how extra local ranks start: "popen" (re-run the script) or "spawn".
        ddp_comm_state: the state passed to ``ddp_comm_hook``.
        ddp_comm_hook: a DDP communication hook (``hook(state, bucket) -> Future``), registered on the HPU.
        ddp_comm_wrapper: wraps ``ddp_comm_hook`` before registration (e.g. a compression wrapper).
        mark_step: ``False`` turns lazy mode's graph cuts off (like ``MarkStep(enabled=False)`` for the Trainer).
        **kwargs: any other ``torch.nn.parallel.DistributedDataParallel`` argument, passed through; checked against
            its signature here, so a misspelled one fails before any process starts.

    Raises:
        TypeError: a keyword argument neither this class nor ``DistributedDataParallel`` takes (with the closest
            name), or one the strategy sets itself (``module``, ``device_ids``).
        ValueError: ``bucket_cap_mb`` or ``timeout`` not a positive finite number, or an unknown ``start_method``.
    """

    strategy_name = "hpu_parallel"
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (DDPStrategy,)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        bucket_cap_mb: float | None = None,
        gradient_as_bucket_view: bool = True,
        static_graph: bool = False,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        start_method: Literal["popen", "spawn"] = "popen",
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        mark_step: bool = True,
        **kwargs: Any,
    ) -> None:
        extra = ddp_arguments(
            HPUParallelStrategy,
            DDPStrategy,
            bucket_cap_mb=bucket_cap_mb,
            broadcast_buffers=broadcast_buffers,
            start_method=start_method,
            kwargs=kwargs,
        )
        self._check_accelerator(accelerator)
        self._collective_timeout = coerce_timeout(timeout)
        self._ddp_arguments = {
            "gradient_as_bucket_view": gradient_as_bucket_view,
            "static_graph": static_graph,
            "find_unused_parameters": find_unused_parameters,
            **extra,
        }
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io or HPUCheckpointIO(),
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=self._collective_timeout,
            start_method=start_method,
            **self._ddp_arguments,
        )
        self._requested_backend = process_group_backend
        self._comm_hook = (ddp_comm_state, ddp_comm_hook, ddp_comm_wrapper)
        self._first_gradients = FirstGradientsRelease()
        # one guard for every backward: entering and leaving it costs well under a microsecond
        self._backward_errors = collective_errors("backward (gradient all-reduce)", self._collective_timeout)
        self._devices = DeviceResolver(type(self).__name__)
        self._init_hpu(mark_step)

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``DistributedDataParallel`` is built with."""
        return dict(self._ddp_arguments)

    @property
    def timeout(self) -> timedelta:
        """How long a collective, a barrier or the process-group set-up waits for its peers."""
        return self._collective_timeout

    @property
    @override
    def process_group_backend(self) -> str:
        """The collective backend: the one asked for, else HCCL on a Gaudi and gloo in emulation."""
        return self._requested_backend or hpu.get_backend().collective_backend

    @override
    def _check_accelerator(self, accelerator: Accelerator | None) -> None:
        super()._check_accelerator(accelerator)
        if accelerator is not None:
            refuse_lazy_emulation(self.strategy_name)

    @property
    @override
    def root_device(self) -> torch.device:
        """This process's device; in emulation an ``"hpu"`` device in ``parallel_devices`` is the emulated one."""
        return self._devices(super().root_device)

    def check_launch(self) -> None:
        """Checks the launch against ``num_nodes`` x ``devices`` and this node's HPUs, and that every device is an HPU.

        Fabric runs it while it is built, once devices, nodes and the cluster environment are final and before the
        launcher starts any process (see :mod:`lightning_gaudi.patches.fabric_connector`), and every process runs it
        again before its process group forms.

        Raises:
            InvalidLaunchError: the launch is malformed or disagrees with ``num_nodes`` x ``devices``.
            ValueError: a device that is no HPU.
        """
        check_launch(self.cluster_environment, self.parallel_devices, self.num_processes, self.num_nodes)
        check_devices(self.parallel_devices, type(self).__name__)

    @override
    def setup_environment(self) -> None:
        # Lightning's DDPStrategy would form its own process group here, without HCCL
        assert self.accelerator is not None
        self.accelerator.setup_device(self.root_device)
        self.setup_distributed()
        self._bind_mark_step()

    def setup_distributed(self) -> None:
        """Checks the launch, sets this process's ranks and forms the process group (HCCL on a Gaudi, gloo in
        emulation); a group that already exists is kept."""
        reset_seed()
        self.check_launch()
        environment = self.cluster_environment
        assert environment is not None
        environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
        environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        form_process_group(self, self.process_group_backend, _log, init_process_group)

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        """Wraps ``module`` in ``DistributedDataParallel`` with the strategy's settings and communication hook."""
        self._bind_mark_step()
        # one process drives one card and the bridge binds it: no device_ids
        ddp = DistributedDataParallel(module=module, device_ids=None, **self._ddp_arguments)
        register_comm_hook(ddp, *self._comm_hook)
        self._first_gradients.arm(self._ddp_arguments)
        return ddp

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        # only transport failures are translated: backward also fails for reasons of its own (shapes, dtypes, NaNs)
        with self._backward_errors:
            super().backward(tensor, module, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, **kwargs)
        self._first_gradients.after_step(optimizer)  # type: ignore[arg-type]
        return output

    @override
    def all_reduce(
        self, tensor: Tensor | Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Tensor | Any:
        """All-reduces ``tensor``; mean is computed as sum / world size (HCCL has no mean), in floating point.

        Raises:
            CollectiveMismatchError: the ranks passed tensors of more than one element in different shapes or dtypes.
            ValueError: ``reduce_op`` is not a reduction HCCL has (sum, min, max; mean as a sum), also in emulation
                and in a single process.
        """
        return all_reduce(tensor, group, reduce_op, self.timeout)

    @override
    def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        with collective_errors(f"barrier {name!r}" if name else "barrier", self.timeout):
            super().barrier(name, *args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with collective_errors("broadcast", self.timeout):
            return super().broadcast(obj, src)

    @override
    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Gathers ``tensor`` from every rank; first checks that all ranks pass the same shape and dtype.

        Raises:
            CollectiveMismatchError: the ranks passed different shapes or dtypes (on every rank, naming each one's).
        """
        with collective_errors("all_gather", self.timeout):
            check_same_layout(tensor, "all_gather", group)
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, init_params in ((cls.strategy_name, {}), *PARALLEL_VARIANTS):
            strategy_registry.register(
                name,
                cls,
                description=f"{cls.__name__} (Fabric) {init_params or ''}".strip(),
                override=True,
                **init_params,
            )
