"""Hydra schemas (under ``lightning_gaudi_schema/``) derived from the plugin's signatures: a dataclass with
``_target_`` and one typed field per keyword argument, so every default lives in one place."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any, Literal, Optional

import torch
from hydra.core.config_store import ConfigStore
from lightning.pytorch.profilers import PyTorchProfiler
from omegaconf import DictConfig

from lightning_gaudi import callbacks
from lightning_gaudi.hpu.runtime import Runtime
from lightning_gaudi.profilers import HPUProfiler
from lightning_gaudi.strategies import HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUParallelStrategy, SingleHPUStrategy

#: The ConfigStore group that holds the schemas, apart from the groups users pick options from.
SCHEMA_GROUP = "lightning_gaudi_schema"


@dataclass(frozen=True)
class Override:
    """How a config spells an argument OmegaConf cannot hold: its type, the default's conversion, and its unit."""

    annotation: Any
    to_config: Callable[[Any], Any]
    doc: str


def _seconds(value: timedelta | float | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


_TIMEOUT = Override(Optional[float], _seconds, "seconds")  # noqa: UP045 - OmegaConf reads typing.Optional
#: Arguments whose config form differs from the class's, by (class, argument).
OVERRIDES: dict[tuple[type, str], Override] = {
    (strategy, "timeout"): _TIMEOUT for strategy in (HPUParallelStrategy, HPUFSDPStrategy, HPUDeepSpeedStrategy)
}

#: Keyword arguments a class hands on through ``**kwargs``: ``(receiver, names)``, offered with the receiver's defaults.
FORWARDED: dict[type, tuple[tuple[Callable[..., Any], tuple[str, ...]], ...]] = {
    HPUProfiler: (
        (PyTorchProfiler.__init__, ("group_by_input_shapes", "export_to_chrome", "record_module_names")),
        (
            torch.profiler.profile.__init__,
            ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"),
        ),
    ),
}

#: The ``conf/callbacks/<name>.yaml`` recipe of each plugin callback.
CALLBACK_CONFIG_NAMES: dict[str, str] = {
    "mark_step": "MarkStep",
    "bf16_autocast": "BF16Autocast",
    "fused_kernels": "FusedKernels",
    "memory_stats": "MemoryStats",
    "throughput": "HPUThroughputMonitor",
    "graph_diagnostics": "GraphDiagnostics",
    "hpu_graphs": "HPUGraphs",
    "compile": "HPUCompile",
    "preemption": "PreemptionCheckpoint",
    "checkpoint_lock": "CheckpointLock",
    "fp8_inference": "FP8Inference",
}

_PRIMITIVES = (int, float, bool, str)


def omegaconf_type(annotation: Any) -> Any:
    """The type OmegaConf checks for ``annotation`` (primitives, enums, literals, lists of str), else ``Any``."""
    args = typing.get_args(annotation)
    optional = type(None) in args and typing.get_origin(annotation) is not Literal
    inner = [a for a in args if a is not type(None)]
    if optional:
        if len(inner) != 1:
            return Any
        base = omegaconf_type(inner[0])
        return Any if base is Any else Optional[base]  # noqa: UP045 - OmegaConf reads typing.Optional
    if annotation in _PRIMITIVES or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is Literal and all(isinstance(a, str) for a in args):
        return str
    homogeneous = origin is not tuple or ... in args
    if origin in (list, tuple, Sequence, Iterable) and inner and inner[0] is str and homogeneous:
        return typing.List[str]  # noqa: UP006 - OmegaConf reads typing.List
    return Any


def _init_hints(target: type) -> tuple[dict[str, Any], inspect.Signature]:
    if dataclasses.is_dataclass(target):
        return typing.get_type_hints(target), inspect.signature(target)
    init = target.__init__  # type: ignore[misc]
    return typing.get_type_hints(init), inspect.signature(init)


def config_defaults(target: type) -> dict[str, Any]:
    """Each keyword argument of ``target`` with its default in config form (``"???"`` where there is none)."""
    _, signature = _init_hints(target)
    defaults: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            defaults[param.name] = "???"
            continue
        override = OVERRIDES.get((target, param.name))
        default = list(param.default) if isinstance(param.default, tuple) else param.default
        defaults[param.name] = override.to_config(param.default) if override else default
    return defaults


def _forwarded(target: type) -> list[tuple[str, Any, Any]]:
    """``(name, type of the default, default)`` of each argument :data:`FORWARDED` lists for ``target``."""
    found = []
    for receiver, names in FORWARDED.get(target, ()):
        parameters = inspect.signature(receiver).parameters
        for name in names:
            default = parameters[name].default if name in parameters else None
            if type(default) not in _PRIMITIVES:
                raise TypeError(
                    f"{receiver.__qualname__} has no argument {name!r} with a plain default any more: update"
                    f" FORWARDED[{target.__name__}] in {__name__}."
                )
            found.append((name, type(default), default))
    return found


def schema_from_signature(target: type, target_path: str) -> type:
    """A dataclass schema with ``_target_`` and one typed field per (forwarded) keyword argument of ``target``."""
    hints, _ = _init_hints(target)
    fields: list[tuple[str, Any, Any]] = [("_target_", str, field(default=target_path))]
    arguments = [(name, hints.get(name, Any), default) for name, default in config_defaults(target).items()]
    for name, hint, default in [*arguments, *_forwarded(target)]:
        override = OVERRIDES.get((target, name))
        annotation = override.annotation if override else omegaconf_type(hint)
        if isinstance(default, (list, dict)):
            fields.append((name, annotation, field(default_factory=functools.partial(copy.deepcopy, default))))
        else:
            fields.append((name, annotation, field(default=default)))
    return dataclasses.make_dataclass(f"{target.__name__}Conf", fields)


@dataclass
class SlurmLauncherConf:
    """hydra-submitit-launcher's ``SlurmQueueConf`` (plugin 1.2), for ``hydra/launcher=gaudi_slurm``."""

    _target_: str = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    timeout_min: int = 60
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    tasks_per_node: int = 1
    mem_gb: int | None = None
    nodes: int = 1
    name: str = "${hydra.job.name}"
    stderr_to_stdout: bool = False
    partition: str | None = None
    qos: str | None = None
    comment: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    gres: str | None = None
    cpus_per_gpu: int | None = None
    gpus_per_task: int | None = None
    mem_per_gpu: str | None = None
    mem_per_cpu: str | None = None
    account: str | None = None
    signal_delay_s: int = 120
    max_num_timeout: int = 0
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    array_parallelism: int = 256
    setup: list[str] | None = None
    srun_args: list[str] | None = None


def check_slurm_launcher(cfg: DictConfig) -> None:
    """Raises ``ValueError`` unless the SLURM launcher runs one task per card on ``trainer.num_nodes`` nodes."""
    launcher = cfg.hydra.launcher
    devices = cfg.trainer.devices
    num_nodes = cfg.trainer.get("num_nodes", 1)
    if not isinstance(devices, int):
        raise ValueError(
            f"trainer.devices={devices!r}: a SLURM launch needs a card count (an int), because SLURM starts one task"
            " per card (hydra.launcher.tasks_per_node)."
        )
    if launcher.tasks_per_node != devices:
        raise ValueError(
            f"hydra.launcher.tasks_per_node={launcher.tasks_per_node} but trainer.devices={devices}: SLURM must start"
            " one task per Gaudi card. Set both to the same number (the gaudi_slurm recipe interpolates it)."
        )
    if launcher.nodes != num_nodes:
        raise ValueError(
            f"hydra.launcher.nodes={launcher.nodes} but trainer.num_nodes={num_nodes}; set both to the same number."
        )


def schemas() -> dict[str, type]:
    """Every schema by its ConfigStore path under :data:`SCHEMA_GROUP` (``"strategy/hpu_parallel"``, ...)."""
    found: dict[str, type] = {
        "strategy/hpu_parallel": schema_from_signature(HPUParallelStrategy, "lightning_gaudi.HPUParallelStrategy"),
        "strategy/hpu_deepspeed": schema_from_signature(HPUDeepSpeedStrategy, "lightning_gaudi.HPUDeepSpeedStrategy"),
        "strategy/hpu_single": schema_from_signature(SingleHPUStrategy, "lightning_gaudi.SingleHPUStrategy"),
        "strategy/hpu_fsdp": schema_from_signature(HPUFSDPStrategy, "lightning_gaudi.HPUFSDPStrategy"),
        "runtime": schema_from_signature(Runtime, "lightning_gaudi.Runtime"),
        "profiler/hpu": schema_from_signature(HPUProfiler, "lightning_gaudi.profilers.HPUProfiler"),
        "hydra/launcher/gaudi_slurm": SlurmLauncherConf,
    }
    for config_name, class_name in CALLBACK_CONFIG_NAMES.items():
        target = getattr(callbacks, class_name)
        found[f"callbacks/{config_name}"] = schema_from_signature(target, f"{callbacks.__name__}.{class_name}")
    return found


def register_schemas() -> None:
    """Stores every schema in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    for path, node in schemas().items():
        group, _, name = f"{SCHEMA_GROUP}/{path}".rpartition("/")
        store.store(group=group, name=name, node=node)
