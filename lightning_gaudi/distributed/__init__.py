"""Launch environment, rank launching, process-group formation and collective errors; Lightning only in functions."""

from lightning_gaudi.distributed.consistency import CollectiveMismatchError, check_same_layout
from lightning_gaudi.distributed.environment import (
    RUN_ID_ENV,
    InvalidLaunchError,
    LaunchEnvironment,
    Launcher,
    SlurmLayout,
    parse_slurm_tasks_per_node,
    validate_launch,
)
from lightning_gaudi.distributed.errors import (
    CollectiveError,
    CollectiveTimeoutError,
    PeerLostError,
    classify,
    collective_errors,
    translate_error,
)
from lightning_gaudi.distributed.launcher import free_port, launch_local_ranks, wait_all
from lightning_gaudi.distributed.ray_train import is_ray_environment, validate_ray_launch
from lightning_gaudi.distributed.rendezvous import (
    DEFAULT_TIMEOUT,
    PortInUseError,
    coerce_timeout,
    init_process_group,
    join_generation,
    uses_agent_store,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "RUN_ID_ENV",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "InvalidLaunchError",
    "LaunchEnvironment",
    "Launcher",
    "PeerLostError",
    "PortInUseError",
    "SlurmLayout",
    "check_same_layout",
    "classify",
    "coerce_timeout",
    "collective_errors",
    "free_port",
    "init_process_group",
    "is_ray_environment",
    "join_generation",
    "launch_local_ranks",
    "parse_slurm_tasks_per_node",
    "translate_error",
    "uses_agent_store",
    "validate_launch",
    "validate_ray_launch",
    "wait_all",
]
