"""Checks a distributed launch before any process starts, connects or writes anything.

:class:`~lightning_gaudi.strategies.HPUParallelStrategy` runs :func:`validate_launch` while the Trainer is built and
again in every process before the process group forms. Each mistake it catches would otherwise surface late and
obscurely: an ``int()`` traceback deep in a launcher, a hang at the first collective, or ranks that silently
train on the wrong shards.
"""

from __future__ import annotations

import os
import re

from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment

__all__ = ["InvalidLaunchError", "parse_slurm_tasks_per_node", "validate_launch"]


class InvalidLaunchError(ValueError):
    """The launcher's settings disagree with the Trainer's, or are malformed."""


def _env_int(name: str, minimum: int = 0) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidLaunchError(
            f"{name}={raw!r} is not a valid value: it must be a whole number >= {minimum}. Fix or unset it"
            " (torchrun, SLURM and Lightning's own launcher set it for you)."
        )
    return value


def _check_master_port() -> None:
    raw = os.environ.get("MASTER_PORT")
    if raw is None:
        return
    try:
        port = int(raw.strip())
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise InvalidLaunchError(
            f"MASTER_PORT={raw!r} is not a TCP port: it must be a number from 1 to 65535 (e.g. MASTER_PORT=29500)."
            " Set it to a free port on the MASTER_ADDR node, the same on every node, or unset it."
        )


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_slurm_tasks_per_node(value: str) -> list[int]:
    """SLURM's compact task list, e.g. ``"4(x2),3"`` -> ``[4, 4, 3]`` (tasks on each node of the allocation).

    Raises:
        InvalidLaunchError: the text is not in SLURM's format.
    """
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise InvalidLaunchError(
                f"SLURM_TASKS_PER_NODE={value!r} is not in SLURM's format (like '4' or '4(x2),3')."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _check_slurm(num_devices: int, num_nodes: int) -> None:
    per_node: list[int] | None = None
    if os.environ.get("SLURM_TASKS_PER_NODE"):
        per_node = parse_slurm_tasks_per_node(os.environ["SLURM_TASKS_PER_NODE"])
    fix = (
        f" Allocate with `--nodes={num_nodes} --ntasks-per-node={num_devices}` (one task per HPU), or set the"
        " Trainer's devices/num_nodes to match the allocation."
    )
    if per_node is not None and len(set(per_node)) > 1:
        raise InvalidLaunchError(
            f"The SLURM allocation runs a different number of tasks on its nodes (SLURM_TASKS_PER_NODE="
            f"{os.environ['SLURM_TASKS_PER_NODE']!r}); every node must run devices={num_devices} tasks.{fix}"
        )
    ntasks_per_node = _env_int("SLURM_NTASKS_PER_NODE", minimum=1)
    tasks = ntasks_per_node if ntasks_per_node is not None else (per_node[0] if per_node else None)
    if tasks is not None and tasks != num_devices:
        raise InvalidLaunchError(
            f"SLURM starts {tasks} task(s) per node, but the Trainer has devices={num_devices}: each task drives one"
            f" HPU, so the two must be equal.{fix}"
        )
    nnodes = _env_int("SLURM_NNODES", minimum=1)
    if nnodes is not None and nnodes != num_nodes:
        raise InvalidLaunchError(
            f"The SLURM allocation has {nnodes} node(s) (SLURM_NNODES), but the Trainer has num_nodes={num_nodes}.{fix}"
        )
    ntasks = _env_int("SLURM_NTASKS", minimum=1)
    if ntasks is not None and ntasks != num_devices * num_nodes:
        raise InvalidLaunchError(
            f"The SLURM allocation has {ntasks} task(s) (SLURM_NTASKS), but num_nodes={num_nodes} x"
            f" devices={num_devices} = {num_devices * num_nodes} processes are needed.{fix}"
        )


def validate_launch(
    cluster_environment: ClusterEnvironment, num_devices: int, num_nodes: int, devices_on_node: int
) -> None:
    """Raises :class:`InvalidLaunchError` when the launch cannot work, before any process starts or connects.

    Checks:

    - ``MASTER_PORT``: a number from 1 to 65535;
    - ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``NODE_RANK``/``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` (where set): whole
      numbers that agree with ``num_nodes`` x ``devices``;
    - ``devices`` no larger than the HPUs this node has;
    - under SLURM: the same number of tasks on every node, equal to ``devices``, and as many nodes as ``num_nodes``.

    Args:
        cluster_environment: the Trainer's cluster environment (decides whether the SLURM checks apply).
        num_devices: processes (HPUs) per node, the Trainer's ``devices``.
        num_nodes: the Trainer's ``num_nodes``.
        devices_on_node: the HPUs this node has.
    """
    _check_master_port()
    world = num_devices * num_nodes
    if num_devices > devices_on_node:
        raise InvalidLaunchError(
            f"devices={num_devices} asks for more HPUs than this node has ({devices_on_node}). Pass devices <="
            f" {devices_on_node} and add nodes (num_nodes) for more processes."
        )
    layout = f"num_nodes={num_nodes} x devices={num_devices} = {world} processes"
    world_size = _env_int("WORLD_SIZE", minimum=1)
    if world_size is not None and world_size != world:
        raise InvalidLaunchError(
            f"The launcher says WORLD_SIZE={world_size}, but the Trainer has {layout}. Launch {world} processes"
            f" (torchrun --nnodes {num_nodes} --nproc-per-node {num_devices}) or change num_nodes/devices."
        )
    rank = _env_int("RANK")
    if rank is not None and rank >= world:
        raise InvalidLaunchError(
            f"RANK={rank} is out of range for {layout} (ranks 0 to {world - 1}). Launch with matching"
            " --nnodes/--nproc-per-node or change num_nodes/devices."
        )
    local_world = _env_int("LOCAL_WORLD_SIZE", minimum=1)
    if local_world is not None and local_world != num_devices:
        raise InvalidLaunchError(
            f"The launcher starts LOCAL_WORLD_SIZE={local_world} process(es) per node, but the Trainer has"
            f" devices={num_devices}. Use --nproc-per-node {num_devices} or devices={local_world}."
        )
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is not None and local_rank >= num_devices:
        raise InvalidLaunchError(
            f"LOCAL_RANK={local_rank} is out of range for devices={num_devices} (local ranks 0 to {num_devices - 1})."
            f" Launch {num_devices} process(es) per node or change devices."
        )
    for name in ("NODE_RANK", "GROUP_RANK"):
        node_rank = _env_int(name)
        if node_rank is not None and node_rank >= num_nodes:
            raise InvalidLaunchError(
                f"{name}={node_rank} is out of range for num_nodes={num_nodes} (node ranks 0 to {num_nodes - 1})."
                " Launch with --nnodes matching num_nodes, or change num_nodes."
            )
    if isinstance(cluster_environment, SLURMEnvironment):
        _check_slurm(num_devices, num_nodes)
