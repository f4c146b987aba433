"""The ``"hpu_fsdp"`` strategy: torch's FullyShardedDataParallel over HCCL (gloo in emulation)."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Callable, Generator, Iterable
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.distributed.checkpoint as dcp
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import FSDPPrecision, Precision
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    FullyShardedDataParallel,
    MixedPrecision,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, enable_wrap
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.distributed import DEFAULT_TIMEOUT
from lightning_gaudi.fsdp_precision import FSDP_PRECISIONS, HPUFSDPPrecision
from lightning_gaudi.safe_load import WeightsOnlyReader
from lightning_gaudi.strategies._staged import METADATA_FILENAME as METADATA_FILENAME  # where readers look
from lightning_gaudi.strategies._staged import save_sharded_checkpoint
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import HPUParallelCore, TrainerParallelCore, refuse_unknown_arguments

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: The sharding strategies by name (``HYBRID_SHARD`` needs ``device_mesh``).
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
#: What the strategy sets itself on ``FullyShardedDataParallel``, or takes as its own argument.
_SET_BY_STRATEGY = ("module", "device_id", "cpu_offload", "mixed_precision", "sharding_strategy")

#: Lightning's FSDP arguments it keeps inside its FSDP keyword arguments, or as derived state (``FSDP_CARRIED``).
FSDP_FOLDED = frozenset(
    {"auto_wrap_policy", "device_mesh", "activation_checkpointing", "activation_checkpointing_policy"}
)
FSDP_CARRIED = ("_activation_checkpointing_kwargs",)

WrapPolicy = set[type[Module]] | list[type[Module] | str] | Callable[[Module, bool, int], bool] | ModuleWrapPolicy


def _module_classes(policy: Iterable[type[Module] | str], argument: str) -> set[type[Module]]:
    """The module classes of a set or list of classes or dotted class paths (a config names them by path)."""
    classes: set[type[Module]] = set()
    for entry in policy:
        cls: object = entry
        if isinstance(entry, str):
            module_path, _, name = entry.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module_path), name) if module_path else None
            except (ImportError, AttributeError) as err:
                raise ValueError(f"`{argument}` names {entry!r}, which cannot be imported: {err}.") from err
        if not (isinstance(cls, type) and issubclass(cls, Module)):
            raise ValueError(
                f"`{argument}` must hold torch.nn.Module classes (or their dotted paths); got {entry!r}. To wrap each"
                " transformer block, pass its class, e.g. {MyBlock} or ['my_pkg.model.MyBlock']."
            )
        classes.add(cls)
    return classes


def _policy(policy: WrapPolicy | None, argument: str) -> Any:
    # any collection of classes or paths: a Hydra config gives a ListConfig
    if isinstance(policy, Iterable) and not isinstance(policy, (str, ModuleWrapPolicy)) and not callable(policy):
        return _module_classes(policy, argument)
    return policy


def _sharding_strategy(value: ShardingStrategy | str) -> ShardingStrategy | str:
    if isinstance(value, ShardingStrategy):
        return value
    if not isinstance(value, str) or value.upper() not in SHARDING_STRATEGIES:
        close = difflib.get_close_matches(str(value).upper(), SHARDING_STRATEGIES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"`sharding_strategy={value!r}` is not a sharding strategy; use one of"
            f" {', '.join(repr(s) for s in SHARDING_STRATEGIES)} or a torch.distributed.fsdp.ShardingStrategy.{hint}"
        )
    return value.upper()


def _check_state_dict_type(value: object) -> None:
    if value not in ("full", "sharded"):
        raise ValueError(
            f"`state_dict_type={value!r}` must be 'full' (one file, gathered on rank 0) or 'sharded' (a directory with"
            " each rank's shard)."
        )


class FSDPCore(HPUParallelCore):
    """What the Trainer's and Fabric's ``hpu_fsdp`` share (placed first in the bases)."""

    strategy_name = "hpu_fsdp"
    backward_collective = "backward (gradient reduce-scatter)"
    forward_collective = "forward (parameter all-gather)"
    #: The attribute of Lightning's strategy holding the other ``FullyShardedDataParallel`` arguments.
    kwargs_attribute: ClassVar[str] = "kwargs"

    @override
    def _check_runnable(self) -> None:
        backend = hpu.get_backend()
        if not backend.is_lazy():
            return
        raise ValueError(
            f"{self.strategy_name!r} cannot run in lazy mode: Intel supports FSDP on Gaudi in eager mode (with or"
            " without torch.compile) only. Run in eager mode: lightning_gaudi.configure(execution_mode='compile') or"
            " 'eager' (PT_HPU_LAZY_MODE=0), or use strategy 'hpu_parallel'."
        )

    def _fsdp_arguments(self) -> dict[str, Any]:
        strategy: Any = self
        return {
            "cpu_offload": strategy.cpu_offload,
            "mixed_precision": strategy.mixed_precision_config,
            "sharding_strategy": strategy.sharding_strategy,
            "device_id": fsdp_device(strategy.root_device),  # Lightning passes the index: none on the CPU nor on "hpu"
            **getattr(self, self.kwargs_attribute),
        }

    def _set_up_sharded(self, module: Module, set_up: Callable[[Module], Module]) -> Module:
        """``set_up(module)`` (Lightning's set-up) with ``module`` wrapped in ``FullyShardedDataParallel`` first, unless
        the user wrapped it; without Lightning's warning that the auto-wrap policy, applied here, was ignored."""
        if any(isinstance(child, FullyShardedDataParallel) for child in module.modules()):
            return set_up(module)
        wrapped = FullyShardedDataParallel(module=module, **self._fsdp_arguments())
        kwargs = getattr(self, self.kwargs_attribute)
        setattr(self, self.kwargs_attribute, {key: value for key, value in kwargs.items() if key != "auto_wrap_policy"})
        try:
            return set_up(wrapped)
        finally:
            setattr(self, self.kwargs_attribute, kwargs)

    def _build_device_mesh(self) -> None:
        kwargs = getattr(self, self.kwargs_attribute)
        if isinstance(kwargs.get("device_mesh"), tuple):  # Lightning would build it on CUDA
            kwargs["device_mesh"] = init_device_mesh(self.root_device.type, kwargs["device_mesh"])


class HPUFSDPStrategy(FSDPCore, TrainerParallelCore, FSDPStrategy):
    """Sharded data-parallel training with torch's ``FullyShardedDataParallel``, one process per card
    (``docs/sharding.md``); lazy mode is refused. With ``accelerator="hpu"``, Lightning's ``"fsdp"`` runs it.

    Args:
        accelerator, parallel_devices, cluster_environment, checkpoint_io, process_group_backend, timeout: as every
            HPU strategy (:class:`~lightning_gaudi.strategies.core.HPUStrategyCore`).
        precision_plugin: an :class:`~lightning_gaudi.HPUFSDPPrecision`; normally ``Trainer(precision=...)``.
        cpu_offload: must stay ``None``/``False`` (Intel documents FSDP on Gaudi without it).
        mixed_precision: torch's ``MixedPrecision`` config; by default it follows the precision plugin.
        auto_wrap_policy: the submodules that become their own FSDP unit: module classes, their dotted paths, or a
            torch wrap policy; without one the model is one unit.
        activation_checkpointing_policy: the submodules that recompute their activations, in the same forms.
        sharding_strategy: ``"FULL_SHARD"`` (default), ``"SHARD_GRAD_OP"``, ``"NO_SHARD"``, ``"HYBRID_SHARD"`` (needs
            ``device_mesh``) or a ``ShardingStrategy``.
        state_dict_type: ``"full"`` (one file from rank 0) or ``"sharded"`` (a folder of every rank's shards).
        device_mesh: for ``HYBRID_SHARD``, ``(replicas, shards)`` or a ``DeviceMesh``.
        **kwargs: any other ``FullyShardedDataParallel`` argument, checked against its signature.

    Raises:
        ValueError: an unknown sharding strategy or ``state_dict_type``, CPU offload, a wrap policy that names no
            module class, a bad ``timeout``, a non-HPU accelerator.
        TypeError: a keyword argument ``FullyShardedDataParallel`` does not take (with the closest name).
    """

    _fsdp_root: Module | None = None
    registered_variants = (("hpu_fsdp_sharded_checkpoint", {"state_dict_type": "sharded"}),)
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (FSDPStrategy,)
    adoption = Adoption(
        extra="kwargs",
        folded=FSDP_FOLDED,
        carried=FSDP_CARRIED,
        # Ray's RayFSDPStrategy gathers a full state dict with offload_to_cpu=True under Lightning < 2.1, which on the
        # CPU frees the storage the state dict views (see _full_state_dict_context)
        prevails=("root_device", "lightning_module_state_dict"),
    )

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        cpu_offload: bool | CPUOffload | None = None,
        mixed_precision: MixedPrecision | None = None,
        auto_wrap_policy: WrapPolicy | None = None,
        activation_checkpointing_policy: WrapPolicy | None = None,
        sharding_strategy: ShardingStrategy | Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"] = (
            "FULL_SHARD"
        ),
        state_dict_type: Literal["full", "sharded"] = "full",
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
        **kwargs: Any,
    ) -> None:
        if cpu_offload is True or (isinstance(cpu_offload, CPUOffload) and cpu_offload.offload_params):
            raise ValueError(
                f"HPUFSDPStrategy got `cpu_offload={cpu_offload!r}`: CPU offload is not offered on HPUs (Intel"
                " documents FSDP on Gaudi without it). Remove it, shard over more cards, or use"
                " activation_checkpointing_policy."
            )
        _check_state_dict_type(state_dict_type)
        accepted = set(inspect.signature(FullyShardedDataParallel.__init__).parameters) - {"self", *_SET_BY_STRATEGY}
        refuse_unknown_arguments(
            "HPUFSDPStrategy", kwargs, accepted, "torch.distributed.fsdp.FullyShardedDataParallel's",
            hint=f" It takes: {', '.join(sorted(accepted))}.", set_by_owner=_SET_BY_STRATEGY,
        )  # fmt: skip
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            cpu_offload=None,
            mixed_precision=mixed_precision,
            auto_wrap_policy=_policy(auto_wrap_policy, "auto_wrap_policy"),
            activation_checkpointing_policy=_policy(activation_checkpointing_policy, "activation_checkpointing_policy"),
            sharding_strategy=_sharding_strategy(sharding_strategy),  # type: ignore[arg-type]  # a checked name
            state_dict_type=state_dict_type,
            device_mesh=device_mesh,
            **kwargs,
        )

    @property
    def state_dict_type(self) -> str:
        """``"full"`` or ``"sharded"`` checkpoints (settable between saves)."""
        return self._state_dict_type

    @state_dict_type.setter
    def state_dict_type(self, value: Literal["full", "sharded"]) -> None:
        _check_state_dict_type(value)
        self._state_dict_type = value

    @property
    def fsdp_device(self) -> torch.device:
        """The ``device_id`` FSDP is given (:func:`fsdp_device`)."""
        return fsdp_device(self.root_device)

    @property  # type: ignore[override]
    @override
    def precision_plugin(self) -> FSDPPrecision:
        plugin = self._precision_plugin
        if plugin is not None:
            assert isinstance(plugin, FSDPPrecision)
            return plugin
        self._precision_plugin = HPUFSDPPrecision("32-true")  # kept: the strategy binds the sharded module to it
        return self._precision_plugin

    @precision_plugin.setter
    @override
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        if precision_plugin is not None and not isinstance(precision_plugin, HPUFSDPPrecision):
            name = getattr(precision_plugin, "precision", "32-true")
            raise TypeError(
                f"HPUFSDPStrategy trains with an HPUFSDPPrecision plugin (autocast on the HPU, FSDP's mixed-precision"
                f" casts), got {type(precision_plugin).__name__}. Pass `Trainer(precision={name!r})` or"
                f" `plugins=[lightning_gaudi.HPUFSDPPrecision({name!r})]`."
            )
        self._precision_plugin = precision_plugin

    def hpu_precision_plugin(self, precision: str) -> Precision:
        """The precision plugin for ``Trainer(precision=...)``; ``ValueError`` for one FSDP does not train in."""
        if precision not in FSDP_PRECISIONS:
            raise ValueError(
                f"`precision={precision!r}` does not run with strategy 'hpu_fsdp'; use one of"
                f" {', '.join(repr(p) for p in FSDP_PRECISIONS)}."
            )
        return HPUFSDPPrecision(precision)  # type: ignore[arg-type]  # checked against the literal's values above

    @override
    def setup_environment(self) -> None:
        self.setup_distributed()  # the process group first: Lightning's set-up then finds it
        self._build_device_mesh()
        super().setup_environment()

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        plugin = self.precision_plugin
        if isinstance(plugin, HPUFSDPPrecision) and isinstance(self.model, FullyShardedDataParallel):
            plugin.bind(self.model)  # gradient clipping by norm needs the root module (the norm spans every shard)

    @override
    def _setup_model(self, model: Module) -> Module:
        root = self._fsdp_root
        if isinstance(root, FullyShardedDataParallel) and root.module is model:
            return root  # validate/test/predict after fit: sharded already (wrapping again would shard the shards)
        root = self._fsdp_root = self._set_up_sharded(model, super()._setup_model)
        return root

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        with enable_wrap(wrapper_cls=FullyShardedDataParallel, **self._fsdp_arguments()):
            yield

    def _full_state_dict_context(self, rank0_only: bool = True) -> AbstractContextManager[Any]:
        # Gathered to host memory on a Gaudi, as Lightning does on CUDA. Not on the CPU: there torch's offload is a
        # no-op move followed by freeing the gathered parameters' storage, which the state dict still views
        offload = self.root_device.type != "cpu"
        assert self.model is not None
        return FullyShardedDataParallel.state_dict_type(
            module=self.model,
            state_dict_type=StateDictType.FULL_STATE_DICT,
            state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
            optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        )

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with self._full_state_dict_context():
            return self.model.state_dict()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Tensor]:
        if self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        assert self.model is not None
        with self._full_state_dict_context():
            state = FullyShardedDataParallel.optim_state_dict(self.model, optimizer)
            if self.is_global_zero:  # keyed by parameter index, as a plain optimizer's: loads without FSDP too
                state = FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state

    @override
    def load_checkpoint_files(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(os.fspath(checkpoint_path)))
        if path.is_file():
            return self._load_full_checkpoint(path, weights_only)
        if not (path.is_dir() and (path / METADATA_FILENAME).is_file()):
            return super().load_checkpoint_files(checkpoint_path, weights_only)
        # A sharded checkpoint, loaded as Lightning does but for a stateless optimizer (SGD without momentum): torch
        # distributed checkpoint keeps no empty "state", and FSDP refuses an optimizer state without one
        assert self.model is not None
        assert self.lightning_module is not None
        with FullyShardedDataParallel.state_dict_type(
            self.model,
            StateDictType.SHARDED_STATE_DICT,
            ShardedStateDictConfig(offload_to_cpu=True),
            ShardedOptimStateDictConfig(offload_to_cpu=True),
        ):
            module_state = {"model": self.model.state_dict()}
            # torch's reader unpickles .metadata without restriction: this one admits only what metadata is made of
            reader_type = FileSystemReader if weights_only is False else WeightsOnlyReader
            dcp.load(module_state, storage_reader=reader_type(path))
            self.model.load_state_dict(module_state["model"], strict=self.lightning_module.strict_loading)
            if self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
                for index, optimizer in enumerate(self.optimizers):
                    key = f"optimizer_{index}"
                    state = load_sharded_optimizer_state_dict(module_state["model"], key, reader_type(path))[key]
                    state.setdefault("state", {})
                    optimizer.load_state_dict(
                        FullyShardedDataParallel.optim_state_dict_to_load(self.model, optimizer, state)
                    )
        return torch.load(path / METADATA_FILENAME, weights_only=weights_only is not False)  # type: ignore[no-any-return]

    def _load_full_checkpoint(self, path: Path, weights_only: bool | None) -> dict[str, Any]:
        # As Lightning loads a full checkpoint, but for an optimizer that keeps no state (SGD without momentum):
        # Lightning 2.6 looks at the first key of its empty "state" (IndexError in FSDPStrategy.load_checkpoint)
        assert self.model is not None
        assert self.lightning_module is not None
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only is not False)
        with self._full_state_dict_context(rank0_only=False):
            self.model.load_state_dict(checkpoint.pop("state_dict"), strict=self.lightning_module.strict_loading)
            states = checkpoint.get("optimizer_states")
            if states is None or self.lightning_module.trainer.state.fn != TrainerFn.FITTING:
                return checkpoint  # type: ignore[no-any-return]
            if len(states) != len(self.optimizers):
                raise RuntimeError(
                    f"The checkpoint {str(path)!r} holds {len(states)} optimizer state(s), but the model configures"
                    f" {len(self.optimizers)} optimizer(s). Resume with the same optimizers, or load only its weights."
                )
            for optimizer, state in zip(self.optimizers, states, strict=True):
                if state["state"] and isinstance(next(iter(state["state"])), int):  # keyed by index, as saved here
                    state = FullyShardedDataParallel.rekey_optim_state_dict(
                        state, OptimStateKeyType.PARAM_NAME, self.model
                    )
                optimizer.load_state_dict(
                    FullyShardedDataParallel.optim_state_dict_to_load(self.model, optimizer, state)
                )
        return checkpoint  # type: ignore[no-any-return]

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        if self._state_dict_type != "sharded":
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        save_sharded_checkpoint(self, checkpoint, filepath, storage_options, model_key="model")


def fsdp_device(device: torch.device) -> torch.device:
    """``device`` with an index on a Gaudi (torch's FSDP takes no index-less accelerator device); the CPU as it is."""
    return device if device.type == "cpu" or device.index is not None else torch.device(device.type, 0)


def has_meta_tensors(module: Module) -> bool:
    """Whether ``module`` has a parameter or buffer on the meta device (``init_module(empty_init=True)``)."""
    return any(tensor.is_meta for tensor in (*module.parameters(), *module.buffers()))
