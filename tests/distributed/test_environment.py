"""LaunchEnvironment.from_env on dict environments: launcher detection, ranks, malformed values, run ids, validation."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from lightning_gaudi.distributed import (
    RUN_ID_ENV,
    InvalidLaunchError,
    LaunchEnvironment,
    SlurmLayout,
    parse_slurm_tasks_per_node,
)

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job7",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "WORLD_SIZE": "8",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
}
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": "8",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1",
}
JSRUN = {
    "LSB_JOBID": "77",
    "LSB_DJOB_RANKFILE": "/tmp/rankfile",
    "JSM_NAMESPACE_SIZE": "4",
    "JSM_NAMESPACE_RANK": "3",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
}
OPEN_MPI = {
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "0",  # not the node's index: the rank among the processes on this node
}
INTEL_MPI = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
#: what Lightning's popen launcher gives local rank 1 of 2
LIGHTNING_POPEN = {
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "40000",
    "NODE_RANK": "0",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
}


Parse = Callable[[dict[str, str]], LaunchEnvironment]


@pytest.fixture
def parse(monkeypatch: pytest.MonkeyPatch) -> Parse:
    """``LaunchEnvironment.from_env()`` with ``environ`` as the whole process environment."""

    def from_env(environ: dict[str, str]) -> LaunchEnvironment:
        monkeypatch.setattr(os, "environ", dict(environ))
        return LaunchEnvironment.from_env()

    return from_env


def _ranks(env: LaunchEnvironment) -> tuple[int | None, ...]:
    return (env.world_size, env.global_rank, env.local_rank, env.node_rank, env.local_world_size)


def test_torchrun(parse: Parse) -> None:
    env = parse(TORCHRUN)
    assert env.launcher == "torchelastic"
    assert _ranks(env) == (8, 5, 1, 1, 4)
    assert (env.master_addr, env.master_port, env.agent_store) == ("node0", 29500, True)
    assert env.run_id == "torchrun-job7"
    assert env.source("node_rank") == "GROUP_RANK"
    assert env.externally_launched
    assert not env.is_global_zero
    assert env.rank_label == "5"


def test_torchrun_prefers_group_rank_and_others_node_rank(parse: Parse) -> None:
    both = {"GROUP_RANK": "1", "NODE_RANK": "0"}
    assert parse({**TORCHRUN, **both}).source("node_rank") == "GROUP_RANK"
    assert parse({**LIGHTNING_POPEN, **both}).source("node_rank") == "NODE_RANK"


def test_srun(parse: Parse) -> None:
    env = parse(SRUN)
    assert env.launcher == "slurm"
    assert _ranks(env) == (8, 6, 2, 1, 4)
    assert env.source("global_rank") == "SLURM_PROCID"
    assert env.source("local_world_size") == "SLURM_TASKS_PER_NODE"
    assert env.run_id == "slurm-1234-0"
    assert env.slurm == SlurmLayout(ntasks=8, nnodes=2, tasks_per_node=(4, 4))
    assert env.externally_launched
    assert env.rank_label == "6"


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_interactive_slurm_is_not_a_slurm_launch(job_name: str, parse: Parse) -> None:
    """As in Lightning: ``srun --job-name=interactive`` (or bash) leaves the launch to another launcher."""
    env = parse({**SRUN, "SLURM_JOB_NAME": job_name})
    assert env.launcher == "none"
    assert env.slurm is not None
    assert env.world_size is None  # SLURM's own counts are not this launch's
    assert env.global_rank == 6  # SLURM_PROCID counts wherever it is set (as the run directory resolvers did)


def test_torchrun_inside_a_slurm_allocation_is_torchrun(parse: Parse) -> None:
    env = parse({**SRUN, **TORCHRUN})
    assert env.launcher == "torchelastic"
    assert env.global_rank == 5
    assert env.run_id == "slurm-1234-0"  # the SLURM job names the run, as before


def test_lsf(parse: Parse) -> None:
    env = parse(JSRUN)
    assert env.launcher == "lsf"
    assert _ranks(env) == (4, 3, 1, None, None)
    assert env.run_id is None


@pytest.mark.parametrize(("environ", "ranks"), [(OPEN_MPI, (4, 2, 0, None, 2)), (INTEL_MPI, (2, 1, 1, None, 2))])
def test_mpi(environ: dict[str, str], ranks: tuple[int | None, ...], parse: Parse) -> None:
    env = parse(environ)
    assert env.launcher == "mpi"
    assert _ranks(env) == ranks
    assert env.externally_launched


def test_a_single_mpi_process_is_no_launch(parse: Parse) -> None:
    """Lightning's MPIEnvironment needs MPI to report more than one process; so does the detection here."""
    assert parse({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}).launcher == "none"


def test_lightning_popen_launcher(parse: Parse) -> None:
    env = parse(LIGHTNING_POPEN)
    assert env.launcher == "local"
    assert _ranks(env) == (2, None, 1, 0, None)
    assert env.externally_launched
    assert not env.is_global_zero
    assert env.rank_label == "0.1"
    assert env.run_id is None


def test_no_launcher(parse: Parse) -> None:
    env = parse({})
    assert env == LaunchEnvironment()
    assert env.launcher == "none"
    assert not env.externally_launched
    assert env.is_global_zero
    assert env.rank_label == "0.0"


def test_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's detection and this parser read the real ``os.environ``, not a copy."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "LSB_", "JSM_", "RANK", "GROUP_RANK")):
            monkeypatch.delenv(name)
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    env = LaunchEnvironment.from_env()
    assert (env.launcher, env.global_rank, env.source("node_rank")) == ("torchelastic", 5, "GROUP_RANK")


@pytest.mark.parametrize(
    ("environ", "zero", "label"),
    [
        ({"RANK": "0", "LOCAL_RANK": "1"}, True, "0"),  # the global rank decides
        ({"SLURM_PROCID": "3"}, False, "3"),
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, False, "1.0"),
        ({"LOCAL_RANK": "0", "GROUP_RANK": "0"}, True, "0.0"),
    ],
)
def test_rank_zero_and_label(environ: dict[str, str], zero: bool, label: str, parse: Parse) -> None:
    env = parse(environ)
    assert (env.is_global_zero, env.rank_label) == (zero, label)


@pytest.mark.parametrize(
    ("name", "value", "minimum"),
    [
        ("WORLD_SIZE", "two", 1),
        ("WORLD_SIZE", "0", 1),
        ("RANK", "-1", 0),
        ("LOCAL_RANK", "1.5", 0),
        ("NODE_RANK", "x", 0),
        ("GROUP_RANK", "x", 0),
        ("LOCAL_WORLD_SIZE", "0", 1),
        ("SLURM_NTASKS", "four", 1),
        ("SLURM_PROCID", "a", 0),
        ("SLURM_NTASKS_PER_NODE", "0", 1),
        ("OMPI_COMM_WORLD_SIZE", "many", 1),
    ],
)
def test_malformed_numbers_name_the_variable(name: str, value: str, minimum: int, parse: Parse) -> None:
    expected = rf"^{name}='{value}' is not a valid value: it must be a whole number >= {minimum}\. Fix or unset it"
    with pytest.raises(InvalidLaunchError, match=expected):
        parse({name: value})


def test_blank_numbers_count_as_unset(parse: Parse) -> None:
    assert parse({"RANK": " ", "WORLD_SIZE": ""}).global_rank is None


@pytest.mark.parametrize("port", ["abc", "", "29500x", "0", "-1", "65536"])
def test_malformed_master_port(port: str, parse: Parse) -> None:
    with pytest.raises(InvalidLaunchError, match=rf"MASTER_PORT='{port}' is not a TCP port.*1 to 65535"):
        parse({"MASTER_PORT": port})


def test_malformed_slurm_task_list(parse: Parse) -> None:
    with pytest.raises(InvalidLaunchError, match=r"SLURM_TASKS_PER_NODE='4x2' is not in SLURM's format"):
        parse({**SRUN, "SLURM_TASKS_PER_NODE": "4x2"})


@pytest.mark.parametrize(
    ("text", "expected"), [("4", [4]), ("4(x2)", [4, 4]), ("4(x2),3", [4, 4, 3]), ("1,2(x2)", [1, 2, 2])]
)
def test_parse_slurm_tasks_per_node(text: str, expected: list[int]) -> None:
    assert parse_slurm_tasks_per_node(text) == expected


# ---------------------------------------------------------------- run id (the rules of the run-directory resolvers)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({RUN_ID_ENV: "exp42", **SRUN}, "exp42"),  # explicit wins
        ({RUN_ID_ENV: "", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}, "slurm-7"),  # empty counts as unset
        ({"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "3", "SLURM_PROCID": "1"}, "slurm-777-3"),
        ({"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "", "SLURM_PROCID": "1"}, "slurm-777-"),
        ({"SLURM_JOB_ID": "777"}, None),  # a job without tasks (sbatch's shell): no shared id
        ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
        ({**OPEN_MPI, "PMIX_NAMESPACE": "2067595265"}, "mpi-2067595265"),
        ({"PMIX_NAMESPACE": "2067595265"}, None),  # PMIx without Open MPI's ranks: e.g. srun --mpi=pmix
        ({}, None),
    ],
)
def test_run_id(environ: dict[str, str], expected: str | None, parse: Parse) -> None:
    assert parse(environ).run_id == expected


def test_static_torchrun_run_id_is_shared_through_the_agent(parse: Parse) -> None:
    env = parse({"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29400"})
    assert env.run_id == f"torchrun-29400-{os.getppid()}"
    assert parse({"TORCHELASTIC_RUN_ID": "none"}).run_id == f"torchrun-0-{os.getppid()}"


# ---------------------------------------------------------------- validate


def test_validate_accepts_a_matching_launch(parse: Parse) -> None:
    parse(TORCHRUN).validate(num_devices=4, num_nodes=2, devices_on_node=8)
    parse(SRUN).validate(num_devices=4, num_nodes=2, devices_on_node=8, slurm=True)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"WORLD_SIZE": "4"}, r"WORLD_SIZE=4, but the Trainer has num_nodes=1 x devices=2 = 2 processes"),
        ({"RANK": "2"}, r"RANK=2 is out of range .* \(global ranks 0 to 1\)"),
        ({"LOCAL_WORLD_SIZE": "4"}, r"LOCAL_WORLD_SIZE=4 process\(es\) per node, but the Trainer has devices=2"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 is out of range for devices=2 \(local ranks 0 to 1\)"),
        ({"NODE_RANK": "1"}, r"NODE_RANK=1 is out of range for num_nodes=1"),
        ({"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "3"}, r"GROUP_RANK=3 is out of range for num_nodes=1"),
    ],
)
def test_validate_rejects_a_launch_that_disagrees(environ: dict[str, str], message: str, parse: Parse) -> None:
    with pytest.raises(InvalidLaunchError, match=message):
        parse(environ).validate(num_devices=2, num_nodes=1, devices_on_node=8)


def test_validate_devices_larger_than_the_node() -> None:
    with pytest.raises(InvalidLaunchError, match=r"devices=4 asks for more HPUs than this node has \(2\)"):
        LaunchEnvironment().validate(num_devices=4, num_nodes=1, devices_on_node=2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SLURM_TASKS_PER_NODE": "4,3", "SLURM_NTASKS": "7"}, r"different number of tasks on its nodes: \[4, 3\]"),
        ({"SLURM_NTASKS_PER_NODE": "2"}, r"SLURM starts 2 task\(s\) per node, but the Trainer has devices=4"),
        ({"SLURM_NNODES": "3"}, r"SLURM allocated 3 node\(s\) \(SLURM_NNODES\), but the Trainer has num_nodes=2"),
        ({"SLURM_NTASKS": "6"}, r"6 task\(s\) \(SLURM_NTASKS\), but num_nodes=2 x devices=4 = 8 processes"),
    ],
)
def test_slurm_checks(changes: dict[str, str], message: str, parse: Parse) -> None:
    env = parse({**SRUN, **changes})
    with pytest.raises(InvalidLaunchError, match=message):
        env.validate(num_devices=4, num_nodes=2, devices_on_node=8)  # slurm=None: SLURM launched it, so they apply
    env.validate(num_devices=4, num_nodes=2, devices_on_node=8, slurm=False)  # another cluster environment
    assert env.slurm is not None
    with pytest.raises(InvalidLaunchError, match=message):
        env.slurm.check(num_devices=4, num_nodes=2)


def test_slurm_counts_are_not_checked_as_generic_variables(parse: Parse) -> None:
    """``srun --ntasks-per-node=1`` starting Lightning's own launcher: SLURM's task count is not the world size."""
    env = parse({**SRUN, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)"})
    env.validate(num_devices=4, num_nodes=2, devices_on_node=8, slurm=False)


# ------------------------------------------------- more processes on the node than it has cards, launches not seen

#: what torchrun gives local rank 0 of node 1 when Kubeflow's numProcPerNode: auto counted 64 CPUs (2 nodes)
TORCHRUN_AUTO = {**TORCHRUN, "WORLD_SIZE": "128", "RANK": "64", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "64"}


@pytest.mark.parametrize("devices", [8, 2])
def test_more_processes_on_the_node_than_cards_names_nproc_per_node_auto(devices: int, parse: Parse) -> None:
    """Checked before the Trainer's layout: whatever ``devices`` is, the launch itself is the mistake."""
    with pytest.raises(InvalidLaunchError) as raised:
        parse(TORCHRUN_AUTO).validate(num_devices=devices, num_nodes=2, devices_on_node=8)
    message = str(raised.value)
    assert "starts 64 processes on this node (LOCAL_WORLD_SIZE=64), but the node has 8 HPUs" in message
    assert "numProcPerNode: auto (Kubeflow) and torchrun --nproc-per-node auto count GPUs only" in message
    assert "numProcPerNode: 8, torchrun --nproc-per-node 8" in message


def test_as_many_processes_as_cards_is_not_too_many(parse: Parse) -> None:
    env = parse({**TORCHRUN, "WORLD_SIZE": "16", "RANK": "9", "LOCAL_WORLD_SIZE": "8"})
    env.validate(num_devices=8, num_nodes=2, devices_on_node=8)


@pytest.mark.parametrize(
    ("environ", "fix"),
    [
        ({**SRUN, "SLURM_NTASKS": "32", "SLURM_TASKS_PER_NODE": "16(x2)"}, "--ntasks-per-node=8"),
        ({**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "32", "OMPI_COMM_WORLD_LOCAL_SIZE": "16"}, "--map-by ppr:8:node"),
    ],
)
def test_more_tasks_than_cards_names_the_launchers_own_fix(environ: dict[str, str], fix: str, parse: Parse) -> None:
    with pytest.raises(InvalidLaunchError, match=r"starts 16 processes on this node .* 8 HPUs") as raised:
        parse(environ).validate(num_devices=8, num_nodes=2, devices_on_node=8)
    assert fix in str(raised.value)
    assert "numProcPerNode" not in str(raised.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"OMPI_COMM_WORLD_SIZE": "6"},
            r"OMPI_COMM_WORLD_SIZE=6, but the Trainer has num_nodes=2 x devices=2 = 4 processes",
        ),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, r"OMPI_COMM_WORLD_LOCAL_SIZE=1 process\(es\) per node, .* devices=2"),
    ],
)
def test_mpi_checks(changes: dict[str, str], message: str, parse: Parse) -> None:
    env = parse({**OPEN_MPI, **changes})
    with pytest.raises(InvalidLaunchError, match=message) as raised:
        env.validate(num_devices=2, num_nodes=2, devices_on_node=8)  # mpi=None: mpirun launched it, so they apply
    assert "mpirun -np 4 --map-by ppr:2:node" in str(raised.value)
    env.validate(num_devices=2, num_nodes=2, devices_on_node=8, mpi=False)  # another cluster environment
    parse(OPEN_MPI).validate(num_devices=2, num_nodes=2, devices_on_node=8)


@pytest.mark.parametrize(
    ("installed", "message"),
    [(False, "mpi4py, which is not installed"), (True, "mpi4py reports a single process: rebuild it")],
)
def test_mpirun_that_lightning_does_not_see_is_named(
    monkeypatch: pytest.MonkeyPatch, installed: bool, message: str, parse: Parse
) -> None:
    """Lightning sees mpirun only through mpi4py: without it, or with it on another MPI, the default environment is
    chosen and every rank would train alone."""
    import importlib.util

    from lightning.fabric.plugins.environments import LightningEnvironment, MPIEnvironment

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "mpi4py":
            return real_find_spec("os") if installed else None
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    env = parse(OPEN_MPI)
    with pytest.raises(InvalidLaunchError, match=r"mpirun started this process \(OMPI_COMM_WORLD_SIZE=4\)") as raised:
        env.check_detected(LightningEnvironment())
    assert message in str(raised.value)
    env.check_detected(MPIEnvironment.__new__(MPIEnvironment))  # detected: nothing to say (not built: needs mpi4py)


#: what Kubeflow Trainer v2 sets in a TrainJob's pods (node 1 of 2): torchrun's settings, nothing for the script
KUBEFLOW_POD = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29500",
}


def test_a_kubeflow_pod_without_torchrun_is_named(parse: Parse) -> None:
    from lightning.fabric.plugins.environments import LightningEnvironment, TorchElasticEnvironment

    env = parse(KUBEFLOW_POD)
    assert env.torchrun_settings == tuple(sorted(KUBEFLOW_POD.items()))
    with pytest.raises(
        InvalidLaunchError, match=r"set up for torchrun \(PET_MASTER_ADDR=job-node-0-0.job, .*Start the"
    ):
        env.check_detected(LightningEnvironment())
    # one pod: Lightning's own launcher (or the Hydra app's) starts the node's ranks as well as torchrun would
    parse({**KUBEFLOW_POD, "PET_NNODES": "1"}).check_detected(LightningEnvironment())
    # under torchrun its workers still see PET_*, and are torchrun's
    parse({**KUBEFLOW_POD, **TORCHRUN}).check_detected(TorchElasticEnvironment())
    parse({**KUBEFLOW_POD, **TORCHRUN}).check_detected(LightningEnvironment())
    parse({}).check_detected(LightningEnvironment())
