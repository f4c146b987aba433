"""Rank processes Ray Train creates and places, each worker driving one card (``docs/ray.md``)."""

from __future__ import annotations

import sys

from lightning_gaudi.distributed.environment import InvalidLaunchError, LaunchEnvironment


def is_ray_environment(cluster_environment: object) -> bool:
    """Whether ``cluster_environment`` is Ray Train's ``RayLightningEnvironment`` (Ray is not imported for it: an
    instance exists only once Ray's module is loaded)."""
    module = sys.modules.get("ray.train.lightning")
    cls = getattr(module, "RayLightningEnvironment", None)
    return isinstance(cls, type) and isinstance(cluster_environment, cls)


def validate_ray_launch(num_devices: int, world_size: int) -> None:
    """Raises :class:`InvalidLaunchError` unless each Ray worker drives one card: ``devices`` is 1 or, in a worker
    that sees every card, the number of workers on this node (Ray sets ``LOCAL_WORLD_SIZE``)."""
    workers_here = LaunchEnvironment.from_env().local_world_size
    if num_devices == 1 or num_devices == workers_here:
        return
    here = f", {workers_here} on this node" if workers_here is not None else ""
    raise InvalidLaunchError(
        f"Ray Train started {world_size} worker(s){here}, each driving one HPU, but the Trainer has"
        f" devices={num_devices} per worker. Pass devices='auto' or 1, with `ScalingConfig(num_workers=...,"
        " resources_per_worker={'HPU': 1})`."
    )
