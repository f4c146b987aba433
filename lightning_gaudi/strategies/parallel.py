"""The ``"hpu_parallel"`` strategy: DistributedDataParallel over HCCL (gloo in emulation)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins import TorchSyncBatchNorm
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
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
from lightning_gaudi.strategies._common import check_hpu_accelerator, prepare_trainer
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
from lightning_gaudi.strategies._tied import find_tied_parameters, move_keeping_ties, restore_ties
from lightning_gaudi.strategies.layer_sync import HPUSyncBatchNorm

if TYPE_CHECKING:
    import lightning.pytorch as pl

# Lightning's handler and level apply to it, so the start-up lines appear where Lightning's own DDP lines would
_log = logging.getLogger("lightning.pytorch.strategies.hpu_parallel")


class HPUParallelStrategy(DDPStrategy):
    """Data-parallel training on several HPUs, one process per card, with ``DistributedDataParallel``.

    On Gaudi the process group uses HCCL (Intel's bridge registers it and ``initialize_distributed_hpu`` maps the
    launcher's variables); in emulation it uses gloo. Multi-node runs use Lightning's cluster environments
    (torchrun, SLURM, MPI, or ``num_nodes`` with ``MASTER_ADDR``/``NODE_RANK``). ``Trainer(sync_batchnorm=True)``
    synchronizes batch norms with :class:`~lightning_gaudi.strategies.HPUSyncBatchNorm`. With ``accelerator="hpu"``,
    Lightning's own DDP names (``"ddp"``, ``"ddp_spawn"``, ``"ddp_find_unused_parameters_true"``...) run this
    strategy with the same settings.

    Args:
        accelerator: normally left to the Trainer (``accelerator="hpu"``).
        parallel_devices: normally left to the Trainer (``devices=...``); in emulation ``torch.device("hpu")`` means
            the emulated device.
        cluster_environment: how ranks find each other; detected by Lightning when not given.
        checkpoint_io: defaults to :class:`~lightning_gaudi.checkpoint_io.HPUCheckpointIO` (CPU tensors, atomic).
        precision_plugin: e.g. :class:`~lightning_gaudi.precision.HPUPrecision`.
        bucket_cap_mb: DDP gradient bucket size in MB (torch's default 25 when ``None``). Larger buckets mean fewer
            all-reduce launches; Intel reports 100 MB best for ResNet50 and 200 MB for ResNeXt101.
        gradient_as_bucket_view: let gradients be views into the all-reduce buckets, saving one gradient copy of
            memory (Intel's advice on Gaudi, hence the default ``True``). The gradients of the first optimizer step
            are then released right after it (``zero_grad(set_to_none=True)``), so DDP's bucket rebuild in the second
            step does not hold two gradient copies at once.
        static_graph: tell DDP the set of used parameters and the graph never change between iterations.
        find_unused_parameters: search the autograd graph for parameters without gradients each step; leave
            ``False`` unless the model really skips parameters (it costs a graph traversal per step).
        broadcast_buffers: broadcast module buffers from rank 0 at each forward; ``None`` leaves torch's default
            (passing it on torch 2.13+, where it is deprecated in favour of ``forward_sync_buffers``, warns).
        process_group_backend: override the collective backend ("hccl" on Gaudi, "gloo" in emulation).
        timeout: how long a collective, a barrier or the process-group set-up waits for its peers before it fails
            with a :class:`~lightning_gaudi.distributed.CollectiveTimeoutError` (so the launcher can restart the
            job; a peer that died fails sooner, with a :class:`~lightning_gaudi.distributed.PeerLostError`); a
            ``timedelta`` or seconds. Default 10 minutes, a third of PyTorch's 30: long enough
            for rank 0 to write a large checkpoint or compile a new graph while the others wait.
        start_method: how extra local ranks start: "popen" (re-run the script) or "spawn".
        ddp_comm_state: the state passed to ``ddp_comm_hook``.
        ddp_comm_hook: a DDP communication hook (``hook(state, bucket) -> Future``), registered on the HPU as on CUDA.
        ddp_comm_wrapper: wraps ``ddp_comm_hook`` before registration (e.g. a compression wrapper).
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
        precision_plugin: Precision | None = None,
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
        **kwargs: Any,
    ) -> None:
        kwargs = ddp_arguments(
            HPUParallelStrategy,
            DDPStrategy,
            bucket_cap_mb=bucket_cap_mb,
            broadcast_buffers=broadcast_buffers,
            start_method=start_method,
            kwargs=kwargs,
        )
        check_hpu_accelerator(self.strategy_name, accelerator)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io or HPUCheckpointIO(),
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=coerce_timeout(timeout),
            start_method=start_method,
            gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph,
            find_unused_parameters=find_unused_parameters,
            **kwargs,
        )
        # registered by configure_ddp: Lightning's DDPStrategy registers communication hooks on CUDA only
        self._comm_hook = (ddp_comm_state, ddp_comm_hook, ddp_comm_wrapper)
        self._first_gradients = FirstGradientsRelease()
        # one guard for every backward: entering and leaving it costs well under a microsecond
        self._backward_errors = collective_errors("backward (gradient all-reduce)", self.timeout)
        # DDP's forward runs collectives of its own: the bucket rebuild of the second step, the buffer broadcast
        self._forward_errors = collective_errors("forward (DDP bucket rebuild or buffer broadcast)", self.timeout)
        self._devices = DeviceResolver(type(self).__name__)

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``DistributedDataParallel`` is built with."""
        return dict(self._ddp_kwargs)

    @property  # type: ignore[override]
    @override
    def accelerator(self) -> Accelerator | None:
        return self._accelerator

    @accelerator.setter
    @override
    def accelerator(self, accelerator: Accelerator | None) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator)
        if accelerator is not None:
            refuse_lazy_emulation(self.strategy_name)
        self._accelerator = accelerator

    @property
    @override
    def root_device(self) -> torch.device:
        """This process's device; in emulation an ``"hpu"`` device in ``parallel_devices`` is the emulated one."""
        return self._devices(super().root_device)

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        # init_process_group: this module's reference, which the tests replace
        form_process_group(self, self._process_group_backend, _log, init_process_group)

    @property
    def timeout(self) -> timedelta:
        """How long a collective, a barrier or the process-group set-up waits for its peers."""
        return self._timeout  # type: ignore[return-value]  # coerced to a timedelta in __init__

    @override
    def set_world_ranks(self) -> None:
        """Checks the launch against ``num_nodes`` x ``devices`` and the node, then sets the ranks.

        Lightning calls this while building the Trainer (after devices, nodes and the cluster environment are final,
        before the launcher starts any process) and again in every process before the process group forms, so a bad
        launch fails here, before anything is started or written (see
        :meth:`lightning_gaudi.distributed.LaunchEnvironment.validate`).
        """
        check_launch(self.cluster_environment, self.parallel_devices, self.num_processes, self.num_nodes)
        super().set_world_ranks()
        check_devices(self.parallel_devices, type(self).__name__)  # a device that is no HPU fails while it is built

    @override
    def barrier(self, name: str | None = None) -> None:
        with collective_errors(f"barrier {name!r}" if name else "barrier", self.timeout):
            super().barrier(name)

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

    @override
    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        # only transport failures are translated: backward also fails for reasons of its own (shapes, dtypes, NaNs)
        with self._backward_errors:
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        # only transport failures are translated; the step's own errors pass through unchanged
        with self._forward_errors:
            return super().training_step(*args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_errors:
            return super().validation_step(*args, **kwargs)

    @override
    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or hpu.get_backend().collective_backend

    @override
    def configure_ddp(self) -> None:
        super().configure_ddp()
        assert isinstance(self.model, DistributedDataParallel)
        register_comm_hook(self.model, *self._comm_hook)
        self._first_gradients.arm(self._ddp_kwargs)

    @override
    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._first_gradients.after_step(optimizer)
        return output

    @override
    def determine_ddp_device_ids(self) -> list[int] | None:
        return None  # one process drives one card; the bridge binds it

    @override
    def reduce(
        self, tensor: Tensor | Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Tensor | Any:
        """All-reduces ``tensor``; mean is computed as sum / world size (HCCL has no mean), in floating point.

        A tensor of more than one element is first checked to have the same shape and dtype on every rank (gloo
        would abort a rank over a mismatch).

        Raises:
            CollectiveMismatchError: the ranks passed different shapes or dtypes (on every rank, naming each one's).
            ValueError: ``reduce_op`` is not a reduction HCCL has (sum, min, max; mean as a sum), also in emulation
                and in a single process.
        """
        return all_reduce(tensor, group, reduce_op, self.timeout)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        move_keeping_ties(self.model, self.root_device)  # Module.to alone unties shared weights on lazy tensors

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        hpu.explain_error(exception)  # adds a note to errors that are an emulator's limits; runs only on failure
        if self.launcher is not None and not isinstance(exception, SIGTERMException):
            # the job has failed: the ranks this process started would wait for it in a collective until the
            # timeout (or hang forever in their own code), holding memory, sockets and, on Gaudi, their card.
            # After a preemption every rank stops at the same step by itself, within its grace period.
            self.launcher.kill(signal.SIGKILL)

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        tied = find_tied_parameters(module) if module is not None else []
        super().teardown()  # moves the module back to the CPU, which would untie them again
        if module is not None:
            restore_ties(module, tied)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.lightning_module is not None:
            prepare_trainer(self.lightning_module.trainer)

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        if type(self._layer_sync) is TorchSyncBatchNorm:  # Trainer(sync_batchnorm=True)
            self._layer_sync = HPUSyncBatchNorm()
        super().setup(trainer)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, init_params in ((cls.strategy_name, {}), *PARALLEL_VARIANTS):
            strategy_registry.register(
                name, cls, description=f"{cls.__name__} {init_params or ''}".strip(), override=True, **init_params
            )
