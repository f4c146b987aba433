"""The HPU strategy core: the mixins every HPU strategy puts before Lightning's class (``docs/development.md``)."""

from __future__ import annotations

import atexit
import difflib
import logging
import os
import signal
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins import TorchSyncBatchNorm
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from typing_extensions import override

from lightning_gaudi import compile_cache, hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.callbacks.checkpoint_lock import add_default_lock
from lightning_gaudi.callbacks.inference import add_default_compile
from lightning_gaudi.callbacks.mark_step import add_default_mark_step
from lightning_gaudi.callbacks.preemption import add_default_preemption
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.distributed import (
    check_same_layout,
    coerce_timeout,
    collective_errors,
    is_ray_environment,
    rendezvous,
    validate_launch,
    validate_ray_launch,
)
from lightning_gaudi.distributed.environment import forget_stale_launch, note_launch
from lightning_gaudi.distributed.shutdown import (
    close_process_group,
    exit_timeout,
    mark_failed,
    run_started,
    stop_ranks,
    watch_ranks,
)
from lightning_gaudi.patches.launcher import hpu_launcher
from lightning_gaudi.patches.no_grad_eval import disable_inference_mode
from lightning_gaudi.resume import load_or_fall_back
from lightning_gaudi.safe_load import check_weights_only
from lightning_gaudi.strategies._tied import find_tied_parameters, move_keeping_ties, restore_ties
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.layer_sync import HPUSyncBatchNorm

#: The Trainers whose start-up line was said (once per Trainer, though each fit sets the strategy up).
_ANNOUNCED: weakref.WeakSet[Any] = weakref.WeakSet()

if TYPE_CHECKING:
    from datetime import timedelta

    import lightning.pytorch as pl


def check_hpu_accelerator(strategy_name: str, accelerator: object, api: str) -> None:
    if accelerator is not None and not isinstance(accelerator, HPUAccelerator):
        raise ValueError(
            f"The {strategy_name!r} strategy runs on HPUs, but the accelerator is {type(accelerator).__name__}."
            f" Pass `{api}(accelerator='hpu', ...)` (on a machine without Gaudi, set LIGHTNING_GAUDI_EMULATE=eager)."
        )


def refuse_unknown_arguments(
    owner: str,
    given: Iterable[str],
    accepted: set[str],
    whose: str,
    candidates: set[str] | None = None,
    hint: str = "",
    set_by_owner: Iterable[str] = (),
) -> None:
    """Raises ``TypeError`` for the first of ``given`` that is in ``set_by_owner`` or not in ``accepted``, naming the
    closest of ``candidates`` (default: ``accepted``), else adding ``hint``."""
    for name in given:
        if name in set_by_owner:
            raise TypeError(f"`{name}` is set by {owner} itself when it wraps the model; remove it.")
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(candidates or accepted), n=1)
            raise TypeError(
                f"{owner} got an unexpected keyword argument {name!r}: it is neither one of its own arguments nor one"
                f" of {whose}.{f' Did you mean {close[0]!r}?' if close else hint}"
            )


def hpu_device(device: torch.device | str | int | None, owner: str) -> torch.device:
    """The backend's ``torch.device`` for ``device`` (``None``, an index, an ``"hpu"`` device or one of the backend's
    type); ``ValueError`` for anything else."""
    backend = hpu.get_backend()
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return backend.device(device)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{owner} got device {device!r}, which is not a device: pass 'hpu' or torch.device('hpu')."
        ) from err
    if parsed.type == backend.device_type:
        return parsed
    if parsed.type == "hpu":
        return backend.device(parsed.index)
    raise ValueError(
        f"{owner} got device {parsed}; pass an HPU device ('hpu', torch.device('hpu')), or none and let the Trainer"
        " pick (accelerator='hpu', devices=N)."
    )


#: The reductions HCCL has (:mod:`lightning_gaudi.hpu.hccl`), by name; a mean is a sum divided by the world size.
HCCL_OPS: dict[str, ReduceOp.RedOpType] = {
    "sum": ReduceOp.SUM,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "product": ReduceOp.PRODUCT,
    "prod": ReduceOp.PRODUCT,
    "mean": ReduceOp.AVG,
    "avg": ReduceOp.AVG,
}


def as_reduce_op(reduce_op: ReduceOp | str | None) -> ReduceOp.RedOpType:
    """The HCCL reduction ``reduce_op`` names (``None``: the mean); ``ValueError`` for one HCCL lacks."""
    if reduce_op is None:
        return ReduceOp.AVG
    if isinstance(reduce_op, str):
        op = HCCL_OPS.get(reduce_op.lower())
        if op is None and not isinstance(getattr(ReduceOp, reduce_op.upper(), None), ReduceOp.RedOpType):
            raise ValueError(
                f"`reduce_op={reduce_op!r}` is not a reduction; use 'mean', 'sum', 'min', 'max', 'product' or a"
                " ReduceOp."
            )
    else:  # a ReduceOp object equals its RedOpType but does not hash like it
        op = next((known for known in HCCL_OPS.values() if reduce_op == known), None)
    if op is not None:
        return op
    raise ValueError(
        f"`reduce_op={reduce_op!r}` is not supported on HPU: HCCL reduces with sum, min, max and product (mean is a"
        " sum divided by the world size). For a bitwise reduction, all_gather the values and combine them."
    )


class HPUStrategyCore:
    """What every HPU strategy adds to Lightning's, for the Trainer and for Fabric (placed first in the bases).

    The arguments every HPU strategy takes: ``accelerator``, ``parallel_devices``, ``cluster_environment`` (normally
    left to the Trainer or Fabric); ``checkpoint_io`` (:class:`~lightning_gaudi.checkpoint_io.HPUCheckpointIO` by
    default); ``process_group_backend`` (HCCL on a Gaudi, gloo in emulation); ``timeout``: how long a collective waits
    for its peers, a ``timedelta`` or seconds (10 minutes by default).
    """

    strategy_name: str
    #: Names registered besides :attr:`strategy_name`, with the arguments each implies.
    registered_variants: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = ()
    #: Which object the user configures, for error messages ("Trainer" or "Fabric").
    api: ClassVar[str] = "Trainer"
    #: How the arguments of a Lightning counterpart's instance are read back to adopt it (:mod:`.adoption`).
    adoption: ClassVar[Adoption] = Adoption()

    _accelerator: Any

    def __init__(self, *args: Any, accelerator: Any = None, **kwargs: Any) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator, self.api)
        if "timeout" in kwargs:
            kwargs["timeout"] = coerce_timeout(kwargs["timeout"])
        if "checkpoint_io" in kwargs:  # CPU tensors in the file, atomic writes
            kwargs["checkpoint_io"] = kwargs["checkpoint_io"] or HPUCheckpointIO()
        super().__init__(*args, accelerator=accelerator, **kwargs)  # type: ignore[call-arg]

    @property
    def accelerator(self) -> Any:
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Any) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator, self.api)
        if accelerator is not None:
            self._check_runnable()
        self._accelerator = accelerator

    def _check_runnable(self) -> None:
        """Raises when this strategy cannot run on the backend in use."""

    def _hpu_device(self, device: torch.device | str | int | None) -> torch.device:
        # resolved once per device: root_device is read for every batch
        resolved: dict[Any, torch.device] = self.__dict__.setdefault("_resolved_devices", {})
        found = resolved.get(device)
        if found is None:
            found = resolved[device] = hpu_device(device, type(self).__name__)
        return found

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Registers :attr:`strategy_name` and :attr:`registered_variants`."""
        for name, init_params in ((cls.strategy_name, {}), *cls.registered_variants):
            description = f"{cls.__name__} ({cls.api}) {init_params or ''}".strip()
            strategy_registry.register(name, cls, description=description, override=True, **init_params)


class SingleDeviceCore(HPUStrategyCore):
    """What the Trainer's and Fabric's ``hpu_single`` share (placed first in the bases)."""

    strategy_name = "hpu_single"
    _requested_device: torch.device | str | int | None

    @property
    def root_device(self) -> torch.device:
        return self._hpu_device(self._requested_device)  # asks the backend once, when the environment is final

    @override
    def _check_runnable(self) -> None:
        self.root_device  # noqa: B018 - a device that is no HPU fails here, while the Trainer or Fabric is built


class HPUParallelCore(HPUStrategyCore):
    """What every distributed HPU strategy adds: launch checks, the process group, collectives that fail clearly."""

    #: What a failed backward or forward was doing, for the error.
    backward_collective: ClassVar[str] = "backward (gradient all-reduce)"
    forward_collective: ClassVar[str] = "forward (DDP bucket rebuild or buffer broadcast)"
    #: A logger under Lightning's, so the start-up lines appear where Lightning's own would.
    log: ClassVar[logging.Logger] = logging.getLogger("lightning.pytorch.strategies.hpu")

    _timeout: timedelta | None
    _process_group_backend: str | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # one guard for every backward: entering and leaving it costs well under a microsecond
        self._backward_errors = collective_errors(self.backward_collective, self.timeout)
        self._forward_errors = collective_errors(self.forward_collective, self.timeout)

    @property
    def timeout(self) -> timedelta:
        """How long a collective, a barrier or the process-group set-up waits for its peers."""
        assert self._timeout is not None  # coerced in __init__
        return self._timeout

    @override
    def _check_runnable(self) -> None:
        backend = hpu.get_backend()
        if backend.single_device_reason is not None:
            raise ValueError(
                f"{self.strategy_name!r} cannot run here: {backend.single_device_reason}, or use one device"
                " (strategy 'hpu_single')."
            )

    @property
    def root_device(self) -> torch.device:
        """The device given (a Ray worker's own card), else the one at the local rank."""
        devices = self.parallel_devices  # type: ignore[attr-defined]
        return self._hpu_device(devices[0] if devices and len(devices) == 1 else super().root_device)  # type: ignore[misc]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        strategy: Any = self
        if is_ray_environment(strategy.cluster_environment):  # num_nodes x devices describe one worker, not the world
            return {"num_replicas": strategy.world_size, "rank": strategy.global_rank}
        return super().distributed_sampler_kwargs  # type: ignore[misc,no-any-return]

    def check_launch(self) -> None:
        """Checks the launcher's variables against ``num_nodes`` x devices and this node's HPUs, and every device;
        runs before any process starts, and again in each process.

        Raises:
            InvalidLaunchError: the launch is malformed or disagrees with the requested layout.
            ValueError: a device that is no HPU, or a malformed ``LIGHTNING_GAUDI_EXIT_TIMEOUT``.
        """
        strategy: Any = self
        environment = strategy.cluster_environment
        if strategy.parallel_devices and is_ray_environment(environment):
            validate_ray_launch(num_devices=strategy.num_processes, world_size=environment.world_size())
        elif strategy.parallel_devices and environment is not None:
            forget_stale_launch(type(self).__name__, strategy.num_processes * strategy.num_nodes)
            validate_launch(
                environment,
                num_devices=strategy.num_processes,
                num_nodes=strategy.num_nodes,
                devices_on_node=hpu.get_backend().device_count(),
            )
        for device in strategy.parallel_devices or ():
            hpu_device(device, type(self).__name__)
        exit_timeout(strategy.timeout)  # checks LIGHTNING_GAUDI_EXIT_TIMEOUT

    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        strategy: Any = self
        strategy._launcher = hpu_launcher(strategy._launcher, watch_ranks, stop_ranks)

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or hpu.get_backend().collective_backend

    def _form_process_group(self) -> None:
        """Sets the ranks, prepares the HPU's collectives and forms the process group unless one exists."""
        reset_seed()
        run_started()
        self._set_ranks()
        backend_name = self._process_group_backend = self._get_process_group_backend()
        strategy: Any = self
        environment = strategy.cluster_environment
        rank, world_size, local_rank = strategy.global_rank, strategy.world_size, strategy.local_rank
        backend = hpu.get_backend()
        backend.init_distributed(world_size, rank, local_rank)
        if dist.is_initialized():
            return
        # torch's env:// rendezvous reads these (as in Lightning's DDP strategies)
        os.environ["MASTER_ADDR"] = environment.main_address
        os.environ["MASTER_PORT"] = str(environment.main_port)
        self.log.info(
            f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{world_size} on HPU {local_rank} of"
            f" node {strategy.node_rank} ({backend.device_description()}, device {self.root_device})"
        )
        atexit.unregister(close_process_group)  # one exit hook per process (several fits), with the latest timeout
        atexit.register(close_process_group, exit_timeout(self.timeout))
        rendezvous.init_process_group(  # the module attribute, which tests replace
            backend_name,
            rank=rank,
            world_size=world_size,
            timeout=self.timeout,
            master_addr=environment.main_address,
            master_port=environment.main_port,
        )
        note_launch(type(self).__name__, world_size)
        if rank == 0:
            self.log.info(
                f"{'-' * 100}\ndistributed_backend={backend_name}\n"
                f"All distributed processes registered. Starting with {world_size} processes\n"
                f"HPUs: {strategy.num_processes} per node x {strategy.num_nodes} node(s),"
                f" {backend.device_description()}{backend.collective_note}\n{'-' * 100}\n"
            )

    def _set_ranks(self) -> None:
        raise NotImplementedError  # the Trainer's and Fabric's cores check the launch and set the ranks their own way

    def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        with collective_errors(f"barrier {name!r}" if name else "barrier", self.timeout):
            super().barrier(name, *args, **kwargs)  # type: ignore[misc]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with collective_errors("broadcast", self.timeout):
            return super().broadcast(obj, src)  # type: ignore[misc]

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Gathers ``tensor`` from every rank; ``CollectiveMismatchError`` when the ranks' shapes or dtypes differ."""
        with collective_errors("all_gather", self.timeout):
            check_same_layout(tensor, "all_gather", group)
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)  # type: ignore[misc]

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        # only transport failures are translated: backward also fails for reasons of its own (shapes, dtypes, NaNs)
        with self._backward_errors:
            output = super().backward(*args, **kwargs)  # type: ignore[misc]
            self._after_backward()
            return output

    def _after_backward(self) -> None:
        """Runs after every backward, inside its collective guard (fast DDP all-reduces the gradients here)."""

    def _all_reduce(self, tensor: Tensor | Any, group: Any | None, reduce_op: ReduceOp | str | None) -> Tensor | Any:
        """All-reduces ``tensor`` with HCCL's reductions (a mean: a float sum divided by the world size), checking the
        layout first; anything else, or outside a process group, as is."""
        if not isinstance(tensor, Tensor):
            return tensor
        op = as_reduce_op(reduce_op)
        if not dist.is_available() or not dist.is_initialized():
            return tensor
        mean = op == ReduceOp.AVG
        result = tensor if tensor.is_floating_point() else tensor.float()
        with collective_errors("all_reduce", self.timeout):
            if result.numel() != 1:  # not for the scalars logging with sync_dist reduces every step
                check_same_layout(result, "all_reduce", group)
            dist.all_reduce(result, op=ReduceOp.SUM if mean else op, group=group)
        return result / dist.get_world_size(group) if mean else result


class TrainerCore(HPUStrategyCore):
    """The Trainer's hooks of every HPU strategy."""

    lightning_module: Any
    model: Any
    launcher: Any

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        compile_cache.use(*compile_cache.strategy_key(self))
        if self.lightning_module is not None:
            self._prepare_trainer(self.lightning_module.trainer)

    def _prepare_trainer(self, trainer: pl.Trainer) -> None:
        """The start-up line (once per Trainer), the default callbacks, and evaluation under ``torch.no_grad`` where
        the backend has no inference mode."""
        if trainer not in _ANNOUNCED:
            _ANNOUNCED.add(trainer)
            strategy = type(self).__name__
            if is_ray_environment(getattr(self, "cluster_environment", None)):  # devices is per worker: say the world
                strategy += f" over {trainer.world_size} Ray Train workers"
            rank_zero_info(hpu.device_summary(trainer.num_devices, strategy, trainer.num_nodes))
        add_default_mark_step(trainer)
        add_default_compile(trainer)
        add_default_preemption(trainer)
        add_default_lock(trainer)
        if not hpu.get_backend().supports_inference_mode:
            disable_inference_mode(trainer)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Loads the checkpoint once it reads under torch's weights-only rules (``weights_only=False`` trusts it),
        falling back past one that fails to load (:func:`lightning_gaudi.resume.load_or_fall_back`)."""
        module = self.lightning_module
        state = getattr(getattr(module, "trainer", None), "state", None)
        call = str(getattr(getattr(state, "fn", None), "value", "fit"))

        def load(path: str) -> dict[str, Any]:
            if weights_only is not False:
                check_weights_only(path)
            return self.load_checkpoint_files(path, weights_only)

        return load_or_fall_back(self, checkpoint_path, load, call)

    def load_checkpoint_files(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Loads one checkpoint: Lightning's strategy's ``load_checkpoint``."""
        load: Callable[..., dict[str, Any]] = super().load_checkpoint  # type: ignore[misc]
        # Lightning 2.5 takes no ``weights_only``; 2.6 passes None unless the user asked for a value
        return load(checkpoint_path) if weights_only is None else load(checkpoint_path, weights_only)

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Moves ``batch`` as Lightning does, its host tensors first given the values the device will hold
        (:meth:`~lightning_gaudi.hpu.Backend.copied_to_device`)."""
        backend = hpu.get_backend()
        if backend.converts_copies:  # the bridge converts in its own copy: no pass over the batch each step
            batch = apply_to_collection(batch, Tensor, backend.copied_to_device)
        return super().batch_to_device(batch, device, dataloader_idx)  # type: ignore[misc]

    def model_to_device(self) -> None:
        move_keeping_ties(self.model, self.root_device)  # type: ignore[attr-defined]  # Module.to unties on lazy tensors

    def teardown(self) -> None:
        module = self.lightning_module
        tied = find_tied_parameters(module) if module is not None else []
        super().teardown()  # type: ignore[misc]  # moves the module back to the CPU, which would untie them again
        if module is not None:
            restore_ties(module, tied)

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # type: ignore[misc]
        hpu.explain_error(exception)  # adds a note to errors that are an emulator's limits; runs only on failure
        mark_failed(130 if isinstance(exception, KeyboardInterrupt) else None)  # no last barrier; Ctrl-C: 130
        if getattr(self, "launcher", None) is not None and not isinstance(exception, SIGTERMException):
            # the ranks this process started would wait for it (holding their cards); preempted ones stop by themselves
            self.launcher.kill(signal.SIGKILL)


class TrainerParallelCore(TrainerCore, HPUParallelCore):
    """The Trainer's hooks of every distributed HPU strategy."""

    _layer_sync: Any

    def set_world_ranks(self) -> None:
        """Checks the launch (:meth:`check_launch`), then sets the ranks."""
        self.check_launch()
        super().set_world_ranks()  # type: ignore[misc]

    @override
    def _set_ranks(self) -> None:
        self.set_world_ranks()

    def setup_distributed(self) -> None:
        """Forms the process group on HCCL (gloo in emulation); one that exists is kept."""
        self._form_process_group()

    # the forward runs collectives too (DDP's buffer broadcast, FSDP's gathers): only transport failures are translated
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_errors:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_errors:
            return super().validation_step(*args, **kwargs)  # type: ignore[misc]

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_errors:
            return super().test_step(*args, **kwargs)  # type: ignore[misc]

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_errors:
            return super().predict_step(*args, **kwargs)  # type: ignore[misc]

    def reduce(
        self, tensor: Tensor | Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Tensor | Any:
        """All-reduces ``tensor`` (:meth:`_all_reduce`).

        Raises:
            CollectiveMismatchError: the ranks passed tensors of more than one element in different shapes or dtypes.
            ValueError: ``reduce_op`` is not a reduction HCCL has (sum, min, max, product; mean as a sum).
        """
        return self._all_reduce(tensor, group, reduce_op)

    def setup(self, trainer: pl.Trainer) -> None:
        if type(self._layer_sync) is TorchSyncBatchNorm:  # Trainer(sync_batchnorm=True)
            self._layer_sync = HPUSyncBatchNorm()
        super().setup(trainer)  # type: ignore[misc]
