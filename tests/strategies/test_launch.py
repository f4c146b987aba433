"""Bad launches fail with a clear error while the Trainer is built, before any process starts or connects.

The checks themselves are tested on dict environments in ``tests/distributed/test_environment.py``; here they run
through ``Trainer(strategy="hpu_parallel")`` as a user meets them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch import Trainer

from lightning_gaudi import HPUParallelStrategy, hpu
from lightning_gaudi.distributed import DEFAULT_TIMEOUT, InvalidLaunchError, validate_launch

HELPER = Path(__file__).parents[1] / "reliability_helpers" / "elastic_fit.py"
_LAUNCH_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture
def launch_env(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Eager emulation with no launcher or SLURM variable set; the test sets the ones it needs."""
    for name in list(os.environ):
        if name in _LAUNCH_VARS or name.startswith(("SLURM_", "OMPI_", "PMI_")):
            monkeypatch.delenv(name)
    return monkeypatch


def _trainer(devices: int = 2, num_nodes: int = 1) -> Trainer:
    return Trainer(
        accelerator="hpu",
        strategy="hpu_parallel",
        devices=devices,
        num_nodes=num_nodes,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )


def _torchrun_env(monkeypatch: pytest.MonkeyPatch, world: int, rank: int, local_world: int, group_rank: int) -> None:
    values = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "GROUP_RANK": str(group_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "TORCHELASTIC_RUN_ID": "test",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_a_good_launch_builds(launch_env: pytest.MonkeyPatch) -> None:
    _torchrun_env(launch_env, world=4, rank=3, local_world=2, group_rank=1)
    trainer = _trainer(devices=2, num_nodes=2)
    assert (trainer.world_size, trainer.global_rank) == (4, 3)


@pytest.mark.parametrize("port", ["abc", "", "29500x", "0", "-1", "65536", "70000"])
def test_master_port_must_be_a_tcp_port(launch_env: pytest.MonkeyPatch, port: str) -> None:
    launch_env.setenv("MASTER_PORT", port)
    with pytest.raises(InvalidLaunchError, match=rf"MASTER_PORT='{port}' is not a TCP port.*1 to 65535"):
        _trainer()


def test_world_size_must_match_nodes_times_devices(launch_env: pytest.MonkeyPatch) -> None:
    _torchrun_env(launch_env, world=4, rank=0, local_world=2, group_rank=0)
    with pytest.raises(InvalidLaunchError, match=r"WORLD_SIZE=4.*num_nodes=1 x devices=2 = 2 processes"):
        _trainer(devices=2, num_nodes=1)


def test_rank_must_be_in_range(launch_env: pytest.MonkeyPatch) -> None:
    launch_env.setenv("RANK", "2")
    with pytest.raises(InvalidLaunchError, match=r"RANK=2 is out of range.*ranks 0 to 1"):
        _trainer(devices=2)


def test_malformed_rank_is_named(launch_env: pytest.MonkeyPatch) -> None:
    launch_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(InvalidLaunchError, match=r"WORLD_SIZE='two' is not a valid value"):
        _trainer(devices=2)


def test_processes_per_node_must_match_devices(launch_env: pytest.MonkeyPatch) -> None:
    _torchrun_env(launch_env, world=4, rank=0, local_world=4, group_rank=0)
    with pytest.raises(InvalidLaunchError, match=r"LOCAL_WORLD_SIZE=4.*devices=2"):
        _trainer(devices=2, num_nodes=2)


def test_node_rank_must_be_below_num_nodes(launch_env: pytest.MonkeyPatch) -> None:
    _torchrun_env(launch_env, world=4, rank=0, local_world=2, group_rank=2)
    with pytest.raises(InvalidLaunchError, match=r"GROUP_RANK=2 is out of range for num_nodes=2"):
        _trainer(devices=2, num_nodes=2)


def test_devices_larger_than_the_node(launch_env: pytest.MonkeyPatch) -> None:
    launch_env.setenv(hpu.DEVICES_ENV, "2")
    hpu._backends.clear()
    with pytest.raises(ValueError, match=r"asks for 4 HPUs but this node has 2"):
        _trainer(devices=4)
    with pytest.raises(InvalidLaunchError, match=r"devices=4 asks for more HPUs than this node has \(2\)"):
        validate_launch(LightningEnvironment(), num_devices=4, num_nodes=1, devices_on_node=2)


def _slurm_env(
    monkeypatch: pytest.MonkeyPatch, tasks_per_node: str, ntasks: int, nnodes: int, ntasks_per_node: int
) -> None:
    """What ``srun`` sets for ``--nodes=nnodes --ntasks-per-node=ntasks_per_node [--ntasks=ntasks]``."""
    values = {
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(ntasks_per_node),
        "SLURM_NNODES": str(nnodes),
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "1234",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "gaudi[0-1]",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_slurm_allocation_matching_the_trainer_builds(launch_env: pytest.MonkeyPatch) -> None:
    _slurm_env(launch_env, "2(x2)", ntasks=4, nnodes=2, ntasks_per_node=2)
    trainer = _trainer(devices=2, num_nodes=2)
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    assert isinstance(trainer.strategy.cluster_environment, SLURMEnvironment)
    assert trainer.world_size == 4


def test_slurm_uneven_tasks_per_node(launch_env: pytest.MonkeyPatch) -> None:
    _slurm_env(launch_env, "2,1", ntasks=3, nnodes=2, ntasks_per_node=2)  # --ntasks=3 cuts the last node
    with pytest.raises(InvalidLaunchError, match=r"different number of tasks on its nodes.*\[2, 1\]"):
        _trainer(devices=2, num_nodes=2)


def test_slurm_tasks_per_node_differ_from_devices(launch_env: pytest.MonkeyPatch) -> None:
    _slurm_env(launch_env, "1(x2)", ntasks=2, nnodes=2, ntasks_per_node=1)
    with pytest.raises(InvalidLaunchError, match=r"SLURM starts 1 task\(s\) per node, but the Trainer has devices=2"):
        _trainer(devices=2, num_nodes=2)


def test_slurm_nodes_differ_from_num_nodes(launch_env: pytest.MonkeyPatch) -> None:
    _slurm_env(launch_env, "2(x3)", ntasks=6, nnodes=3, ntasks_per_node=2)
    with pytest.raises(InvalidLaunchError, match=r"3 node\(s\) \(SLURM_NNODES\).*num_nodes=2"):
        _trainer(devices=2, num_nodes=2)


def test_slurm_task_list_in_the_wrong_format(launch_env: pytest.MonkeyPatch) -> None:
    _slurm_env(launch_env, "2x2", ntasks=4, nnodes=2, ntasks_per_node=2)
    with pytest.raises(InvalidLaunchError, match=r"SLURM_TASKS_PER_NODE='2x2' is not in SLURM's format"):
        _trainer(devices=2, num_nodes=2)


def test_timeout_default_and_settable(eager_hpu: hpu.Backend) -> None:
    assert HPUParallelStrategy().timeout == DEFAULT_TIMEOUT == timedelta(minutes=10)
    assert HPUParallelStrategy(timeout=90).timeout == timedelta(seconds=90)
    assert HPUParallelStrategy(timeout=timedelta(seconds=5)).timeout == timedelta(seconds=5)
    with pytest.raises(ValueError, match=r"`timeout=0` must be a positive, finite number of seconds"):
        HPUParallelStrategy(timeout=0)
    with pytest.raises(TypeError, match=r"`timeout='10m'` must be a datetime.timedelta or a number of seconds"):
        HPUParallelStrategy(timeout="10m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`timeout=-60.0` must be a positive, finite number of seconds"):
        HPUParallelStrategy(timeout=-60.0)  # what Hydra passes for strategy.timeout=-60
    for not_finite in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`timeout=(nan|inf)` must be a positive, finite number of seconds"):
            HPUParallelStrategy(timeout=not_finite)


@pytest.mark.subprocess
def test_torchrun_with_the_wrong_process_count_fails_before_training(tmp_path: Path) -> None:
    """torchrun starts 2 processes on a node, the script asks for 1 device: both fail at Trainer(), write nothing."""
    env = {**os.environ, hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(HELPER)]
    cmd += [str(tmp_path / "out"), "--num-nodes", "1", "--devices", "1"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert "InvalidLaunchError: The launcher says WORLD_SIZE=2, but the Trainer has num_nodes=1 x devices=1" in (
        result.stdout + result.stderr
    )
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == [], written  # no checkpoint, no step: nothing ran


def test_more_processes_on_the_node_than_cards_fails_at_the_trainer(launch_env: pytest.MonkeyPatch) -> None:
    """What every rank of a Kubeflow job with ``numProcPerNode: auto`` meets: torchrun counted 64 CPUs on the node."""
    launch_env.setenv(hpu.DEVICES_ENV, "8")
    hpu._backends.clear()
    _torchrun_env(launch_env, world=128, rank=64, local_world=64, group_rank=1)
    with pytest.raises(InvalidLaunchError, match=r"starts 64 processes on this node .* the node has 8 HPUs") as raised:
        _trainer(devices=8, num_nodes=2)
    assert "set it to the number of Gaudi cards (numProcPerNode: 8, torchrun --nproc-per-node 8)" in str(raised.value)


def test_a_kubeflow_pod_started_without_torchrun_fails_at_the_trainer(launch_env: pytest.MonkeyPatch) -> None:
    """Kubeflow Trainer v2 sets only torchrun's PET_* variables: a plain ``python train.py`` would train alone."""
    pod = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1", "PET_MASTER_PORT": "29500"}
    for name, value in pod.items():
        launch_env.setenv(name, value)
    with pytest.raises(InvalidLaunchError, match=r"set up for torchrun .*Start the command with `torchrun`"):
        _trainer(devices=2, num_nodes=2)
