"""What every process of a Hydra job does first: apply the runtime settings, then check the launch."""

from __future__ import annotations

from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.distributed.environment import LaunchEnvironment
from lightning_gaudi.hpu import get_backend, runtime


def local_world_size(cfg: DictConfig) -> int:
    """How many processes this machine runs for ``cfg``: the HPU count ``trainer.devices`` selects (1 elsewhere)."""
    accelerator = cfg.trainer.get("accelerator")
    if accelerator != "hpu" and not (accelerator in ("auto", None) and HPUAccelerator.is_available()):
        return 1
    devices = cfg.trainer.get("devices", "auto")
    if OmegaConf.is_config(devices):
        devices = OmegaConf.to_container(devices)
    return len(HPUAccelerator.parse_devices(cast(Any, devices)))


def apply_runtime(cfg: DictConfig) -> runtime.Runtime:
    """Applies ``cfg.runtime`` before anything loads the bridge; returns the settings in force."""
    node = cfg.get("runtime")
    values = {} if node is None else cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
    values.pop("_target_", None)
    return runtime.configure(runtime.Runtime(**values))  # a malformed value raises its own ValueError here


def check_launch(cfg: DictConfig) -> None:
    """Under SLURM, raises ``InvalidLaunchError`` unless the allocation matches the trainer (one task per card)."""
    env = LaunchEnvironment.from_env()
    if env.launcher != "slurm":
        return
    env.validate(
        num_devices=local_world_size(cfg),
        num_nodes=int(cfg.trainer.get("num_nodes", 1)),
        devices_on_node=get_backend().device_count(),
        slurm=True,
    )


def prepare(cfg: DictConfig) -> runtime.Runtime:
    """:func:`apply_runtime`, then :func:`check_launch`. Returns the runtime settings in force."""
    settings = apply_runtime(cfg)
    check_launch(cfg)
    return settings
