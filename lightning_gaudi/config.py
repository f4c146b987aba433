"""Typed schemas for the plugin's Hydra configs, registered in Hydra's ConfigStore.

The YAML recipes under ``conf/`` name these schemas first in their defaults lists, so Hydra checks every override
against them: a key that is not a field (``strategy.bucket_cap_mbb=3``) is an error naming the key, and a value of
the wrong type (``strategy.bucket_cap_mb=big``) is an error naming the field. Call :func:`register_configs` (done
on import) before Hydra composes a config.

Schemas, under the ConfigStore group ``lightning_gaudi_schema`` (kept apart from the groups users pick from):

- ``strategy/hpu_parallel``: :class:`HPUParallelStrategyConf`; ``strategy/hpu_single``: :class:`SingleHPUStrategyConf`.
- ``callbacks/<name>``: one per callback of :mod:`lightning_gaudi.callbacks`, built from its signature (see
  :data:`CALLBACK_CONFIG_NAMES`).
- ``emulation``: :class:`EmulationConf` (the bridge's own settings are the ``bridge_settings`` callback's).
- ``hydra/launcher/gaudi_slurm``: :class:`SlurmLauncherConf`, the fields of hydra-submitit-launcher's
  ``SlurmQueueConf`` (checked by :func:`check_slurm_launcher`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from lightning_gaudi import hpu


class EmulationMode(str, Enum):
    """How :func:`apply_emulation` chooses between a real Gaudi and the CPU emulator.

    ``auto``: keep ``LIGHTNING_GAUDI_EMULATE`` if it is set; else use the real Gaudi when Intel's bridge is installed;
    else emulate in eager mode (and say so). ``eager``/``lazy``: emulate in that mode. ``off``: require a Gaudi.
    """

    auto = "auto"
    eager = "eager"
    lazy = "lazy"
    off = "off"


class GaudiName(str, Enum):
    """The Gaudi generation the emulator reports."""

    GAUDI = "GAUDI"
    GAUDI2 = "GAUDI2"
    GAUDI3 = "GAUDI3"


@dataclass
class EmulationConf:
    """Where the HPU comes from when there is no Gaudi (``LIGHTNING_GAUDI_*`` variables).

    Attributes:
        mode: see :class:`EmulationMode`.
        devices: emulated cards per node; ``None`` keeps ``LIGHTNING_GAUDI_DEVICES`` (default 8).
        device_name: emulated generation; ``None`` keeps ``LIGHTNING_GAUDI_DEVICE_NAME`` (default GAUDI2).
    """

    mode: EmulationMode = EmulationMode.auto
    devices: int | None = None
    device_name: GaudiName | None = None


@dataclass
class TimeoutConf:
    """A ``datetime.timedelta``, for collective timeouts."""

    _target_: str = "datetime.timedelta"
    minutes: float = 10.0


@dataclass
class HPUParallelStrategyConf:
    """:class:`~lightning_gaudi.strategies.HPUParallelStrategy`'s knobs (DDP over HCCL; gloo in emulation)."""

    _target_: str = "lightning_gaudi.HPUParallelStrategy"
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool | None = None
    process_group_backend: str | None = None
    timeout: TimeoutConf = field(default_factory=TimeoutConf)
    start_method: str = "popen"


@dataclass
class SingleHPUStrategyConf:
    """:class:`~lightning_gaudi.strategies.SingleHPUStrategy`: one process, one card."""

    _target_: str = "lightning_gaudi.SingleHPUStrategy"


@dataclass
class SlurmLauncherConf:
    """hydra-submitit-launcher's ``SlurmQueueConf`` (plugin 1.2), for ``hydra/launcher=gaudi_slurm``.

    One SLURM task drives one Gaudi card, so ``tasks_per_node`` must equal ``trainer.devices`` and ``nodes`` must
    equal ``trainer.num_nodes``; the recipe interpolates both, and :func:`check_slurm_launcher` verifies them.
    """

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


#: The ConfigStore group that holds the schemas, apart from the groups users pick options from.
SCHEMA_GROUP = "lightning_gaudi_schema"

#: Callback schemas, by config name, built by :func:`register_configs` from the callbacks' signatures.
CALLBACK_SCHEMAS: dict[str, type] = {}


def _schema_from_signature(name: str, target: type, target_path: str) -> type:
    """A dataclass schema with ``_target_`` and one typed field per keyword argument of ``target.__init__``."""
    init = target.__init__  # type: ignore[misc]
    hints = typing.get_type_hints(init)
    fields: list[tuple[str, Any, Any]] = [("_target_", str, field(default=target_path))]
    for param in inspect.signature(init).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = _omegaconf_type(hints.get(param.name, Any))
        default = param.default
        if default is inspect.Parameter.empty:
            fields.append((param.name, annotation, field(default="???")))
        elif isinstance(default, (list, dict, set, tuple)):
            fields.append((param.name, annotation, field(default_factory=functools.partial(copy.deepcopy, default))))
        else:
            fields.append((param.name, annotation, field(default=default)))
    return dataclasses.make_dataclass(f"{name}Conf", fields)


def _omegaconf_type(annotation: Any) -> Any:
    """``annotation`` if OmegaConf can check it (primitives, ``Optional`` of one, enums), else ``Any``."""
    primitives = (int, float, bool, str)
    if annotation in primitives:
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(annotation) and args[0] in primitives:
        return args[0] | None
    return Any


def _callback_schemas() -> dict[str, type]:
    """Schemas for the callbacks :mod:`lightning_gaudi.callbacks` exports, derived from their signatures."""
    from lightning_gaudi import callbacks

    schemas: dict[str, type] = {}
    for config_name, class_name in CALLBACK_CONFIG_NAMES.items():
        if not hasattr(callbacks, class_name):
            raise ImportError(
                f"lightning_gaudi.callbacks has no {class_name} for conf/callbacks/{config_name}.yaml; update"
                " CALLBACK_CONFIG_NAMES in lightning_gaudi/config.py together with the recipe."
            )
        target = getattr(callbacks, class_name)
        schemas[config_name] = _schema_from_signature(class_name, target, f"{callbacks.__name__}.{class_name}")
    return schemas


#: The ``conf/callbacks/<name>.yaml`` recipe of each plugin callback.
CALLBACK_CONFIG_NAMES: dict[str, str] = {
    "mark_step": "MarkStep",
    "bf16_autocast": "BF16Autocast",
    "fused_optimizers": "FusedOptimizers",
    "memory_stats": "MemoryStats",
    "throughput": "HPUThroughputMonitor",
    "lazy_diagnostics": "LazyModeDiagnostics",
    "bridge_settings": "BridgeSettings",
    "hpu_graphs": "HPUGraphs",
}


def register_configs() -> None:
    """Stores the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(group=f"{SCHEMA_GROUP}/strategy", name="hpu_parallel", node=HPUParallelStrategyConf)
    cs.store(group=f"{SCHEMA_GROUP}/strategy", name="hpu_single", node=SingleHPUStrategyConf)
    cs.store(group=SCHEMA_GROUP, name="emulation", node=EmulationConf)
    cs.store(group=f"{SCHEMA_GROUP}/hydra/launcher", name="gaudi_slurm", node=SlurmLauncherConf)
    CALLBACK_SCHEMAS.clear()
    CALLBACK_SCHEMAS.update(_callback_schemas())
    for name, schema in CALLBACK_SCHEMAS.items():
        cs.store(group=f"{SCHEMA_GROUP}/callbacks", name=name, node=schema)


def apply_emulation(conf: DictConfig | EmulationConf) -> str | None:
    """Exports the emulation settings and says what runs; call before anything asks for an HPU.

    Returns:
        A line for the user when this call switched emulation on by itself, else ``None``.

    Raises:
        ValueError: an emulation setting is malformed.
    """
    mode = EmulationMode(conf.mode)
    message = None
    if mode is EmulationMode.auto:
        if hpu.emulation_mode() is None and not hpu.bridge_installed():
            os.environ[hpu.EMULATE_ENV] = "eager"
            message = (
                f"lightning_gaudi: no Gaudi here (Intel's bridge is not installed) and {hpu.EMULATE_ENV} is unset:"
                f" emulating the HPU on the CPU in eager mode ({hpu.EMULATE_ENV}=eager). Its numbers are CPU numbers."
            )
    elif mode is EmulationMode.off:
        os.environ.pop(hpu.EMULATE_ENV, None)
    else:
        os.environ[hpu.EMULATE_ENV] = mode.value
    if conf.devices is not None:
        if conf.devices < 1:
            raise ValueError(f"emulation.devices={conf.devices} must be a positive number of emulated cards.")
        os.environ[hpu.DEVICES_ENV] = str(conf.devices)
    if conf.device_name is not None:
        os.environ[hpu.DEVICE_NAME_ENV] = GaudiName(conf.device_name).value
    hpu.emulation_mode()  # a malformed value in the environment fails here, naming the variable
    return message


def check_slurm_launcher(cfg: DictConfig) -> None:
    """Checks a composed config's SLURM launcher against its trainer: one task per card, one SLURM node per node.

    Raises:
        ValueError: ``hydra.launcher.tasks_per_node != trainer.devices`` or ``nodes != trainer.num_nodes``.
    """
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


register_configs()
