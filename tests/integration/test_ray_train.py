"""Ray Train's Lightning integration with ``accelerator="hpu"`` (``docs/ray.md``).

The quick tests build Ray's objects in this process as a Ray worker would (no cluster): the launch check, the device,
the sampler, ``prepare_trainer``. The ``subprocess`` tests read one job on a local 2-worker Ray cluster that
``tests/helpers/ray_train_job.py`` starts and stops (about 3 minutes on 2 busy cores): Ray's documented pattern on
the emulated HPU equals the same code on the CPU, a checkpoint Ray kept resumes, Fabric runs in a Ray worker, Intel's
recipe (``{"HPU": 1}`` workers, ``TorchConfig(backend="hccl")``) runs Ray's own HPU code path on the bridge double, and
no Ray process outlives the job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.shared_job import run_once
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

import lightning_gaudi
from lightning_gaudi import hpu
from lightning_gaudi.distributed import InvalidLaunchError, is_ray_environment, validate_ray_launch
from lightning_gaudi.strategies.core import HPUParallelCore
from lightning_gaudi.strategies.deepspeed import DEEPSPEED_AVAILABLE

ray_lightning = pytest.importorskip(
    "ray.train.lightning", reason="Ray Train is not installed (the `ray` extra: pip install 'lightning-gaudi[ray]')"
)
psutil = pytest.importorskip("psutil", reason="psutil finds the processes a Ray cluster leaves (the `dev` extra)")

JOB_TIMEOUT_S = 540
HELPERS_DIR = Path(__file__).parents[1] / "helpers"


class WorkerOneOfTwo(ray_lightning.RayLightningEnvironment):
    """``RayLightningEnvironment`` as Ray's second worker on a node of two sees it (Ray's context needs a cluster)."""

    def world_size(self) -> int:
        return 2

    def global_rank(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 1

    def node_rank(self) -> int:
        return 0


@pytest.fixture
def ray_worker(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> hpu.Backend:
    """The environment Ray Train gives its second worker of two on one node, its own card only (Ray's HPU resource)."""
    launch = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0"}
    for name, value in launch.items():  # what Ray Train's TorchConfig sets in each worker
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(hpu.VISIBLE_MODULES_ENV, "1")
    hpu._backends.clear()
    return hpu.get_backend()


def _trainer(strategy: Any, devices: Any = "auto") -> Trainer:
    return Trainer(
        accelerator="hpu", devices=devices, strategy=strategy, plugins=[WorkerOneOfTwo()], logger=False, max_epochs=1
    )


def test_is_ray_environment() -> None:
    assert is_ray_environment(ray_lightning.RayLightningEnvironment())
    assert not is_ray_environment(LightningEnvironment())
    assert not is_ray_environment(None)


@pytest.mark.parametrize("strategy", ["RayDDPStrategy", "RayFSDPStrategy", "hpu_parallel"])
def test_rays_pattern_builds_in_a_worker_with_its_own_card(ray_worker: hpu.Backend, strategy: str) -> None:
    given = getattr(ray_lightning, strategy)() if strategy.startswith("Ray") else strategy
    trainer = _trainer(given)  # before: "The launcher says WORLD_SIZE=2, but the Trainer has ... devices=1"
    assert trainer.num_devices == 1  # devices="auto": the one card Ray gave this worker
    assert trainer.strategy.root_device == ray_worker.device()
    assert trainer.strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}  # Ray's world, not 1 x 1
    if strategy.startswith("Ray"):
        assert ray_lightning.prepare_trainer(trainer) is trainer  # Ray's check of its own classes passes
    else:  # documented: `hpu_parallel` runs without prepare_trainer, which accepts Ray's classes only
        with pytest.raises(RuntimeError, match="Invalid strategy class"):
            ray_lightning.prepare_trainer(trainer)


def test_on_a_gaudi_the_worker_trains_on_its_card_not_where_ray_would_put_it(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's RayDDPStrategy.root_device is ray.train.torch.get_device(): the CPU in a worker without Ray's HPU resource
    # (and an error outside a worker, as here)
    bridge_double.configure(device_count=1)  # the bridge under HABANA_VISIBLE_MODULES=<this worker's card>
    launch = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0"}
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    trainer = _trainer(ray_lightning.RayDDPStrategy())
    assert trainer.num_devices == 1
    assert trainer.strategy.root_device == torch.device("hpu")
    assert trainer.strategy._get_process_group_backend() == "hccl"


@pytest.mark.skipif(not DEEPSPEED_AVAILABLE, reason="DeepSpeed is not installed (the `deepspeed` extra)")
def test_rays_deepspeed_strategy_is_adopted(ray_worker: hpu.Backend) -> None:
    trainer = _trainer(ray_lightning.RayDeepSpeedStrategy(stage=2))
    assert isinstance(trainer.strategy, lightning_gaudi.HPUDeepSpeedStrategy)
    assert ray_lightning.prepare_trainer(trainer) is trainer


def test_the_hpu_decides_the_device_and_the_full_state_dict_of_rays_strategies(ray_worker: hpu.Backend) -> None:
    # Ray's own root_device is ray.train.torch.get_device() (the CPU in a worker without Ray's HPU resource); its
    # RayFSDPStrategy gathers the state dict with offload_to_cpu=True on Lightning < 2.1
    ddp = type(_trainer(ray_lightning.RayDDPStrategy()).strategy)
    fsdp = type(_trainer(ray_lightning.RayFSDPStrategy()).strategy)
    assert ddp.root_device is HPUParallelCore.__dict__["root_device"]
    assert fsdp.root_device is HPUParallelCore.__dict__["root_device"]
    assert fsdp.lightning_module_state_dict is lightning_gaudi.HPUFSDPStrategy.lightning_module_state_dict
    assert issubclass(fsdp, ray_lightning.RayFSDPStrategy)


def test_devices_beyond_the_workers_own_card_name_devices_auto(ray_worker: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"HABANA_VISIBLE_MODULES='1'.*pass devices='auto'.*num_workers"):
        _trainer(ray_lightning.RayDDPStrategy(), devices=2)


def test_the_launch_check_under_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    validate_ray_launch(num_devices=1, world_size=4)  # one card per worker
    validate_ray_launch(num_devices=2, world_size=4)  # every card visible: the card at the local rank
    with pytest.raises(InvalidLaunchError, match=r"started 4 worker\(s\), 2 on this node.*devices=8 per worker"):
        validate_ray_launch(num_devices=8, world_size=4)


def test_ray_environment_without_ray_is_not_taken_for_torchrun(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the torchrun check still applies to Lightning's own environment with the same variables
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidLaunchError, match="WORLD_SIZE=2"):
        Trainer(accelerator="hpu", devices=1, strategy=DDPStrategy(), logger=False)


# --- a local Ray cluster ---------------------------------------------------------------------------------------------


def _session_processes(session: int) -> list[str]:
    found = []
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(process.info["pid"]) == session:
                found.append(f"{process.info['pid']} {process.info['name']}")
        except (ProcessLookupError, PermissionError):
            continue
    return found


def _run_job(folder: Path) -> None:
    folder.mkdir(parents=True)
    ray_temp = tempfile.mkdtemp(prefix="lgray", dir="/tmp")  # Ray's socket paths must stay short
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HELPERS_DIR.parents[1]), os.environ.get("PYTHONPATH", "")]),
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS": "0",
    }
    env.pop(hpu.EMULATE_ENV, None)  # the driver needs no HPU: the workers get it through Ray's runtime_env
    command = [sys.executable, str(HELPERS_DIR / "ray_train_job.py"), str(folder), ray_temp]
    # a session of its own: Ray's processes (GCS, raylet, workers) all stay in it, so none can go unnoticed
    with open(folder / "job.log", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
    deadline = time.monotonic() + 30  # ray.shutdown() returns before the last process has exited
    while _session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _session_processes(process.pid)
    if left:
        os.killpg(process.pid, signal.SIGKILL)
    shutil.rmtree(ray_temp, ignore_errors=True)
    (folder / "outcome.json").write_text(json.dumps({"returncode": returncode, "left": left}))


@pytest.fixture(scope="module")
def ray_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_once(tmp_path_factory, "ray_train_job", _run_job)


def _weights(folder: Path, case: str) -> dict[str, torch.Tensor]:
    path = folder / f"{case}.pt"
    assert path.exists(), f"{case} did not finish; see {folder / 'job.log'}"
    return torch.load(path)


def _assert_equal(folder: Path, case: str, control: str) -> None:
    got, expected = _weights(folder, case), _weights(folder, control)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=f"{case} {key} != {control}")


@pytest.mark.subprocess
def test_the_job_ends_and_leaves_no_ray_process(ray_job: Path) -> None:
    outcome = json.loads((ray_job / "outcome.json").read_text())
    assert outcome["returncode"] == 0, (ray_job / "job.log").read_text()[-6000:]
    assert outcome["left"] == []


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("case", "control"),
    [
        ("ddp_hpu", "ddp_cpu"),  # RayDDPStrategy + RayLightningEnvironment + prepare_trainer + devices="auto"
        ("fsdp_hpu", "ddp_cpu"),  # RayFSDPStrategy (stock FSDP refuses the CPU); its full state dict
        ("hpu_parallel", "ddp_cpu"),  # strategy="hpu_parallel" by name, no prepare_trainer
        pytest.param(
            "deepspeed_hpu",  # RayDeepSpeedStrategy(stage=2) (stock DeepSpeed refuses the CPU)
            "ddp_cpu",
            marks=pytest.mark.skipif(not DEEPSPEED_AVAILABLE, reason="DeepSpeed is not installed (`deepspeed` extra)"),
        ),
        ("fabric_hpu", "fabric_cpu"),  # Fabric in a Ray worker
        ("ddp_hccl", "ddp_cpu"),  # Intel's recipe: {"HPU": 1}, TorchConfig(backend="hccl"), on the bridge double
    ],
)
def test_ray_workers_on_the_hpu_equal_the_cpu(ray_job: Path, case: str, control: str) -> None:
    _assert_equal(ray_job, case, control)


@pytest.mark.subprocess
def test_each_worker_used_its_own_card_and_rays_process_group(ray_job: Path) -> None:
    for rank in (0, 1):
        facts = json.loads((ray_job / f"facts.cases.rank{rank}.json").read_text())
        assert facts["ddp_hpu"]["strategy"][:3] == ["RayDDPStrategy", "RayDDPStrategy", "HPUParallelStrategy"]
        assert facts["fsdp_hpu"]["strategy"][2] == "HPUFSDPStrategy"
        cases = ("ddp_hpu", "fsdp_hpu", "hpu_parallel", *(("deepspeed_hpu",) if DEEPSPEED_AVAILABLE else ()))
        for case in cases:
            assert facts[case]["num_devices"] == 1
            assert facts[case]["world_size"] == 2
            assert facts[case]["sampler_kwargs"] == {"num_replicas": 2, "rank": rank}
        assert facts["fabric_hpu"]["strategy"] == "HPUParallelStrategy"
        assert all(fact["kept_rays_group"] for fact in facts.values())
    assert "using: 1 HPU, strategy RayDDPStrategy over 2 Ray Train workers" in (ray_job / "job.log").read_text()


@pytest.mark.subprocess
def test_rays_own_hpu_path_runs_on_the_bridge_double(ray_job: Path) -> None:
    """Ray gave each worker one ``HPU``: its HPU device manager found the card through the double's
    ``habana_frameworks.torch.hpu``, its ``TorchConfig(backend="hccl")`` group is the double's, and the plugin trained
    on the one card Ray made visible."""
    cards = set()
    for rank in (0, 1):
        facts = json.loads((ray_job / f"facts.hccl.rank{rank}.json").read_text())["ddp_hccl"]
        assert facts["device_manager"] == "HPUTorchDeviceManager"
        assert facts["ray_device"] == "hpu"
        assert facts["torch_hpu"] == "habana_frameworks.torch.hpu"  # registered by the double's core, as the bridge
        assert facts["backend"] == "hccl"
        assert facts["kept_rays_group"]
        assert facts["num_devices"] == 1
        assert facts["sampler_kwargs"] == {"num_replicas": 2, "rank": rank}
        assert facts["strategy"][2] == "HPUParallelStrategy"
        assert facts["master_port"] != "12345"
        cards.add(facts["visible_modules"])
    assert len(cards) == 2  # one card each


@pytest.mark.subprocess
def test_a_checkpoint_reported_through_ray_resumes(ray_job: Path) -> None:
    reported = json.loads((ray_job / "reported.json").read_text())
    assert {(r["case"], r["epoch"]) for r in reported} >= {(1.0, 0), (1.0, 1)}  # ddp_hpu reported each epoch
    # "resumed" started from the checkpoint Ray kept after ddp_hpu's first epoch and trained its second epoch
    _assert_equal(ray_job, "resumed", "ddp_hpu")
