"""The launch environment, rank launching, process-group formation and collective errors, one job per module.

- :mod:`~lightning_gaudi.distributed.environment`: :class:`LaunchEnvironment`, the launcher's variables parsed and
  validated once (which launcher, ranks, ``MASTER_ADDR``/``MASTER_PORT``, SLURM's layout, the shared run id);
- :mod:`~lightning_gaudi.distributed.launcher`: :func:`launch_local_ranks`, one process per local card;
- :mod:`~lightning_gaudi.distributed.rendezvous`: :func:`init_process_group`, restart-safe process-group formation
  (:class:`PortInUseError` when ``MASTER_PORT`` is taken);
- :mod:`~lightning_gaudi.distributed.errors`: :class:`CollectiveTimeoutError` / :class:`PeerLostError` for a peer that
  hung or died; user errors pass through unchanged;
- :mod:`~lightning_gaudi.distributed.consistency`: :func:`check_same_layout`, the same tensor layout on every rank.

Nothing here imports Lightning at module level.
"""

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
    "join_generation",
    "launch_local_ranks",
    "parse_slurm_tasks_per_node",
    "translate_error",
    "uses_agent_store",
    "validate_launch",
    "wait_all",
]
