"""The launcher's variables parsed once into :class:`LaunchEnvironment` (the launcher as Lightning's cluster
environments detect it) and checked against the Trainer's ``num_nodes`` x ``devices`` before any process starts."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch.distributed as dist

if TYPE_CHECKING:
    from lightning.fabric.plugins.environments import ClusterEnvironment

#: An id every rank of one launch shares, set by the user or a job script; see :attr:`LaunchEnvironment.run_id`.
RUN_ID_ENV = "LIGHTNING_GAUDI_RUN_ID"

#: Which launcher started the process: ``"none"`` when no launcher did (a plain ``python train.py``).
Launcher = Literal["torchelastic", "slurm", "lsf", "mpi", "local", "none"]

_GENERIC = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"})
_MPI = frozenset({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
#: What Lightning's launcher and the process group's rendezvous set in the process that launches the ranks.
_LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


class InvalidLaunchError(ValueError):
    """The launcher's settings disagree with the Trainer's, or are malformed."""


@dataclass(frozen=True)
class _InProcessLaunch:
    owner: str
    world_size: int
    before: tuple[tuple[str, str | None], ...]
    left: tuple[tuple[str, str], ...]


_before_launch: dict[str, str | None] | None = None  # the variables before this process launched ranks itself
_earlier_launch: _InProcessLaunch | None = None


def forget_stale_launch(owner: str, world: int) -> None:
    """Puts back the launch variables an earlier launch in this process left once its process group is gone, so they
    are not taken for an external launcher's; then notes the variables before a launch from this process.

    Raises:
        InvalidLaunchError: the earlier launch's group is alive, and ``world`` is not its size.
    """
    global _before_launch, _earlier_launch
    earlier = _earlier_launch
    if earlier is not None and all(os.environ.get(name) == value for name, value in earlier.left):
        alive = dist.is_available() and dist.is_initialized()
        if alive and earlier.world_size != world:
            left = ", ".join(f"{name}={value}" for name, value in earlier.left)
            raise InvalidLaunchError(
                f"{owner} needs {world} processes, but an earlier launch in this process ({earlier.owner},"
                f" {earlier.world_size} process(es)) left its process group and {left}: no external launcher set"
                " them. Run each in a process of its own, or end the earlier group first with"
                " torch.distributed.destroy_process_group()."
            )
        if not alive:
            for name, value in earlier.before:
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            _earlier_launch = None
    if not LaunchEnvironment.from_env().externally_launched:
        _before_launch = {name: os.environ.get(name) for name in _LAUNCH_VARIABLES}


def note_launch(owner: str, world_size: int) -> None:
    """Records the launch variables a launch from this process set once it formed its process group, for
    :func:`forget_stale_launch`."""
    global _before_launch, _earlier_launch
    before, _before_launch = _before_launch, None
    if before is None:
        return
    left = tuple((n, v) for n in _LAUNCH_VARIABLES if (v := os.environ.get(n)) is not None and v != before[n])
    _earlier_launch = _InProcessLaunch(owner, world_size, tuple(before.items()), left)


def read_int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    """``environ[name]`` as a whole number ``>= minimum``, ``None`` when unset or blank; otherwise raises
    :class:`InvalidLaunchError`."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdecimal() or int(raw) < minimum:
        raise InvalidLaunchError(
            f"{name}={environ[name]!r} is not a valid value: it must be a whole number >= {minimum}. Fix or unset it"
            " (torchrun, SLURM and Lightning's own launcher set it for you)."
        )
    return int(raw)


def read_master_port(environ: Mapping[str, str]) -> int | None:
    """``MASTER_PORT`` as a TCP port, ``None`` when unset; otherwise raises :class:`InvalidLaunchError`."""
    raw = environ.get("MASTER_PORT")
    if raw is None:
        return None
    if not raw.strip().isdecimal() or not 1 <= int(raw) <= 65535:
        raise InvalidLaunchError(
            f"MASTER_PORT={raw!r} is not a TCP port: it must be a number from 1 to 65535 (e.g. MASTER_PORT=29500)."
            " Set it to a free port on the MASTER_ADDR node, the same on every node, or unset it."
        )
    return int(raw)


def parse_slurm_tasks_per_node(value: str) -> list[int]:
    """SLURM's compact task list (``SLURM_TASKS_PER_NODE``), e.g. ``"4(x2),3"`` -> ``[4, 4, 3]``."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise InvalidLaunchError(f"SLURM_TASKS_PER_NODE={value!r} is not in SLURM's format (like '4(x2),3').")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


@dataclass(frozen=True)
class SlurmLayout:
    """SLURM's allocation: ``SLURM_NTASKS``, ``SLURM_NNODES``, ``SLURM_NTASKS_PER_NODE`` and
    ``SLURM_TASKS_PER_NODE`` (expanded), ``None`` where unset."""

    ntasks: int | None = None
    nnodes: int | None = None
    ntasks_per_node: int | None = None
    tasks_per_node: tuple[int, ...] | None = None

    def check(self, num_devices: int, num_nodes: int) -> None:
        """Raises :class:`InvalidLaunchError` unless the allocation runs one task per HPU on ``num_nodes`` nodes."""
        world, per_node = num_devices * num_nodes, self.tasks_per_node or ()
        tasks = self.ntasks_per_node if self.ntasks_per_node is not None else next(iter(per_node), None)
        fix = f" Allocate `--nodes={num_nodes} --ntasks-per-node={num_devices}` (a task per HPU) or change the Trainer."
        if len(set(per_node)) > 1:
            raise InvalidLaunchError(f"SLURM runs a different number of tasks on its nodes: {list(per_node)}.{fix}")
        if tasks not in (None, num_devices):
            raise InvalidLaunchError(
                f"SLURM starts {tasks} task(s) per node, but the Trainer has devices={num_devices}.{fix}"
            )
        if self.nnodes not in (None, num_nodes):
            raise InvalidLaunchError(
                f"SLURM allocated {self.nnodes} node(s) (SLURM_NNODES), but the Trainer has num_nodes={num_nodes}.{fix}"
            )
        if self.ntasks not in (None, world):
            raise InvalidLaunchError(
                f"SLURM allocated {self.ntasks} task(s) (SLURM_NTASKS), but num_nodes={num_nodes} x"
                f" devices={num_devices} = {world} processes are needed.{fix}"
            )


def _detect(environ: Mapping[str, str]) -> Launcher:
    """The launcher, as Lightning's cluster environments detect it, torchrun first (it may run inside SLURM)."""
    from lightning.fabric.plugins.environments import LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return "torchelastic"
    if SLURMEnvironment.detect():
        return "slurm"
    if LSFEnvironment.detect():
        return "lsf"
    # Lightning's MPIEnvironment asks mpi4py; mpirun's own variables also tell a launch that mpi4py cannot see
    if (read_int(environ, "OMPI_COMM_WORLD_SIZE", 1) or read_int(environ, "PMI_SIZE", 1) or 1) > 1:
        return "mpi"
    return "local" if "LOCAL_RANK" in environ else "none"


def _run_id(environ: Mapping[str, str]) -> str | None:
    if explicit := environ.get(RUN_ID_ENV):
        return explicit
    if "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ:
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{environ['SLURM_JOB_ID']}" + (f"-{step}" if step is not None else "")
    if (run_id := environ.get("TORCHELASTIC_RUN_ID")) is not None:
        # static rendezvous (plain torchrun on one node, run id "none"): the ranks share the agent, their parent
        return (
            f"torchrun-{run_id}" if run_id != "none" else f"torchrun-{environ.get('MASTER_PORT', '0')}-{os.getppid()}"
        )
    namespace = environ.get("PMIX_NAMESPACE")
    if namespace and "OMPI_COMM_WORLD_SIZE" in environ:
        return f"mpi-{namespace}"  # Open MPI: one PMIx namespace per mpirun job, the same on every node
    return None


@dataclass(frozen=True)
class LaunchEnvironment:
    """Who started this process and where it sits in the job (:meth:`from_env`). Each rank value comes from the
    generic variable (``WORLD_SIZE``, ``RANK``...), else the launcher's own; :meth:`source` names it.
    ``torchrun_settings``: the ``PET_*`` variables (torchrun's arguments, which Kubeflow sets in each pod)."""

    launcher: Launcher = "none"
    world_size: int | None = None
    global_rank: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    agent_store: bool = False
    slurm: SlurmLayout | None = None
    sources: tuple[tuple[str, str], ...] = ()
    torchrun_settings: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls) -> LaunchEnvironment:
        """Parses ``os.environ``; a malformed variable raises :class:`InvalidLaunchError`. The run id is
        ``LIGHTNING_GAUDI_RUN_ID``, else the launcher's job id (SLURM, torchrun, Open MPI), else ``None``."""
        env = os.environ
        slurm = SlurmLayout(
            ntasks=read_int(env, "SLURM_NTASKS", 1),
            nnodes=read_int(env, "SLURM_NNODES", 1),
            ntasks_per_node=read_int(env, "SLURM_NTASKS_PER_NODE", 1),
            tasks_per_node=tuple(parse_slurm_tasks_per_node(text))
            if (text := env.get("SLURM_TASKS_PER_NODE"))
            else None,
        )
        launcher = _detect(env)
        values: dict[str, int] = {}
        sources: list[tuple[str, str]] = []

        def pick(attribute: str, *candidates: tuple[str, int]) -> None:
            for name, minimum in candidates:
                value = read_int(env, name, minimum)
                if value is not None and attribute not in values:
                    values[attribute] = value
                    sources.append((attribute, name))

        node_vars = (("GROUP_RANK", 0), ("NODE_RANK", 0))
        pick("world_size", ("WORLD_SIZE", 1))
        pick("global_rank", ("RANK", 0), ("SLURM_PROCID", 0))
        pick("local_rank", ("LOCAL_RANK", 0))
        pick("node_rank", *(node_vars if launcher == "torchelastic" else node_vars[::-1]))
        pick("local_world_size", ("LOCAL_WORLD_SIZE", 1))
        if launcher == "slurm":
            pick("world_size", ("SLURM_NTASKS", 1))
            pick("local_rank", ("SLURM_LOCALID", 0))
            pick("node_rank", ("SLURM_NODEID", 0))
            pick("local_world_size", ("SLURM_NTASKS_PER_NODE", 1))
            nodeid, per_node = read_int(env, "SLURM_NODEID"), slurm.tasks_per_node
            if "local_world_size" not in values and per_node and nodeid is not None and nodeid < len(per_node):
                values["local_world_size"] = per_node[nodeid]
                sources.append(("local_world_size", "SLURM_TASKS_PER_NODE"))
        elif launcher == "lsf":
            pick("world_size", ("JSM_NAMESPACE_SIZE", 1))
            pick("global_rank", ("JSM_NAMESPACE_RANK", 0))
            pick("local_rank", ("JSM_NAMESPACE_LOCAL_RANK", 0))
        elif launcher == "mpi":
            pick("world_size", ("OMPI_COMM_WORLD_SIZE", 1), ("PMI_SIZE", 1))
            pick("global_rank", ("OMPI_COMM_WORLD_RANK", 0), ("PMI_RANK", 0))
            pick("local_rank", ("OMPI_COMM_WORLD_LOCAL_RANK", 0), ("MPI_LOCALRANKID", 0))
            # no node index: Open MPI's OMPI_COMM_WORLD_NODE_RANK is the process's rank among those on its node
            pick("local_world_size", ("OMPI_COMM_WORLD_LOCAL_SIZE", 1), ("MPI_LOCALNRANKS", 1))
        return cls(
            launcher=launcher,
            master_addr=env.get("MASTER_ADDR", "").strip() or None,
            master_port=read_master_port(env),
            run_id=_run_id(env),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            slurm=None if slurm == SlurmLayout() else slurm,
            sources=tuple(sources),
            torchrun_settings=tuple(sorted((name, value) for name, value in env.items() if name.startswith("PET_"))),
            **values,
        )

    def source(self, attribute: str) -> str | None:
        """The variable ``attribute`` (e.g. ``"global_rank"``) was read from, or ``None`` when it is unset."""
        return next((name for attr, name in self.sources if attr == attribute), None)

    @property
    def externally_launched(self) -> bool:
        """Whether a launcher started this process, so it must not start rank processes of its own."""
        return self.launcher != "none"

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank zero: by the global rank where known, else local and node rank 0."""
        return self.global_rank == 0 if self.global_rank is not None else not self.local_rank and not self.node_rank

    @property
    def rank_label(self) -> str:
        """The global rank as text, or ``"<node rank>.<local rank>"`` when no global rank is known."""
        return (
            str(self.global_rank) if self.global_rank is not None else f"{self.node_rank or 0}.{self.local_rank or 0}"
        )

    def validate(
        self, num_devices: int, num_nodes: int, devices_on_node: int, slurm: bool | None = None, mpi: bool | None = None
    ) -> None:
        """Raises :class:`InvalidLaunchError` unless the processes and ``devices`` fit the node's HPUs and the rank
        variables agree with ``num_nodes`` x ``devices``; SLURM's and MPI's are checked when ``slurm``/``mpi`` (by
        default: when that launcher started this process)."""
        world = num_devices * num_nodes
        self._check_processes_per_node(devices_on_node)
        if num_devices > devices_on_node:
            raise InvalidLaunchError(
                f"devices={num_devices} asks for more HPUs than this node has ({devices_on_node}). Pass devices <="
                f" {devices_on_node} and add nodes (num_nodes) for more processes."
            )
        mpi = self.launcher == "mpi" if mpi is None else mpi
        checked = _GENERIC | _MPI if mpi else _GENERIC
        layout = f"num_nodes={num_nodes} x devices={num_devices} = {world} processes"
        sizes = {"world_size": (world, f", but the Trainer has {layout}")}
        sizes["local_world_size"] = (num_devices, f" process(es) per node, but the Trainer has devices={num_devices}")
        limits = {"global_rank": (world, layout), "local_rank": (num_devices, f"devices={num_devices}")}
        limits["node_rank"] = (num_nodes, f"num_nodes={num_nodes}")
        fix = f"Start `mpirun -np {world} --map-by ppr:{num_devices}:node`" if mpi else "Launch with torchrun"
        fix += "" if mpi else f" --nnodes {num_nodes} --nproc-per-node {num_devices}"
        for attribute, name in self.sources:
            value = getattr(self, attribute)
            if name in checked and attribute in sizes and value != sizes[attribute][0]:
                why = sizes[attribute][1]
            elif name in checked and attribute in limits and value >= limits[attribute][0]:
                limit, setting = limits[attribute]
                why = f" is out of range for {setting} ({attribute.split('_')[0]} ranks 0 to {limit - 1})"
            else:
                continue
            raise InvalidLaunchError(f"The launcher says {name}={value}{why}. {fix}, or change num_nodes/devices.")
        if (self.launcher == "slurm" if slurm is None else slurm) and self.slurm is not None:
            self.slurm.check(num_devices, num_nodes)

    def _check_processes_per_node(self, devices_on_node: int) -> None:
        per_node, n = self.local_world_size, devices_on_node
        if per_node is None or per_node <= n:
            return
        fix = {"slurm": f"Allocate `--ntasks-per-node={n}`.", "mpi": f"Start `mpirun --map-by ppr:{n}:node`."}.get(
            self.launcher,
            "numProcPerNode: auto (Kubeflow) and torchrun --nproc-per-node auto count GPUs only (on a node without"
            f" them, CPUs): set it to the number of Gaudi cards (numProcPerNode: {n}, torchrun --nproc-per-node {n}).",
        )
        raise InvalidLaunchError(
            f"The launcher starts {per_node} processes on this node ({self.source('local_world_size')}={per_node}),"
            f" but the node has {n} HPUs and each process drives one. {fix}"
        )

    def check_detected(self, cluster_environment: ClusterEnvironment) -> None:
        """Raises :class:`InvalidLaunchError` when a launcher started this process but Lightning chose its default
        environment (no launcher): ``mpirun`` without a working ``mpi4py``, or a multi-node Kubeflow pod without
        torchrun."""
        from lightning.fabric.plugins.environments import LightningEnvironment

        if type(cluster_environment) is not LightningEnvironment:
            return
        if self.launcher == "mpi":
            cause = "Lightning sees MPI only through mpi4py, which is not installed (scripts/install-mpi.sh)"
            if importlib.util.find_spec("mpi4py") is not None:
                cause = "mpi4py reports a single process: rebuild it for this mpirun's MPI (`pip install --no-binary"
                cause += " mpi4py mpi4py`)"
            raise InvalidLaunchError(
                f"mpirun started this process ({self.source('world_size')}={self.world_size}), but {cause}: every"
                " rank would train on its own. Fix mpi4py, or launch with torchrun or SLURM."
            )
        if self.launcher == "none" and dict(self.torchrun_settings).get("PET_NNODES", "1") not in ("1", "1:1"):
            listed = ", ".join(f"{name}={value}" for name, value in self.torchrun_settings)
            raise InvalidLaunchError(
                f"This pod is set up for torchrun ({listed}: set by Kubeflow's TrainJob or PyTorchJob), but the script"
                " was started without it: every pod would train on its own. Start the command with `torchrun`, e.g."
                " `torchrun examples/train.py ...` or `torchrun --no-python lightning-gaudi fit ...`."
            )


def validate_launch(
    cluster_environment: ClusterEnvironment, num_devices: int, num_nodes: int, devices_on_node: int
) -> None:
    """:meth:`LaunchEnvironment.check_detected` and :meth:`LaunchEnvironment.validate` of this process."""
    from lightning.fabric.plugins.environments import MPIEnvironment, SLURMEnvironment

    launch = LaunchEnvironment.from_env()
    launch.check_detected(cluster_environment)
    slurm, mpi = isinstance(cluster_environment, SLURMEnvironment), isinstance(cluster_environment, MPIEnvironment)
    launch.validate(num_devices, num_nodes, devices_on_node, slurm=slurm, mpi=mpi)
