"""Kubernetes: the Kubeflow manifests in ``docs/k8s/`` (a Trainer v2 TrainJob with its ClusterTrainingRuntime, a v1
PyTorchJob) parsed and checked against Kubeflow's fields and this repository, and the environment their pods get
(torchrun driven by Kubeflow's ``PET_*`` variables) run end to end as two nodes on loopback.

What Kubeflow sets in a pod is written down here from its sources (kubeflow/trainer v2.3:
``pkg/runtime/framework/plugins/torch/torch.go``; v1.9.4: ``pkg/controller.v1/pytorch/envvar.go`` and ``master.go``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch
import yaml
from helpers.configs import compose_train
from helpers.loopback_nodes import FIT, free_port, loopback_env, run_nodes, two_node_job
from helpers.shared_job import run_once
from torch.distributed import run as torchrun

import lightning_gaudi.app.hydra  # noqa: F401  (the config schemas the recipes compose from)
from lightning_gaudi import hpu
from lightning_gaudi.app.cli import main as cli_main

sys.path.insert(0, str(FIT.parent))
import elastic_fit

ROOT = Path(__file__).parents[2]
K8S = ROOT / "docs" / "k8s"
GAUDI = "habana.ai/gaudi"
#: where docs/k8s/Dockerfile puts the repository in the image
IMAGE_ROOT = "/workspace/lightning_gaudi"

#: the fields of a TrainJob's ``spec.trainer`` (trainjob_types.go, ``Trainer``)
TRAINER_FIELDS = {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
#: the fields of a PyTorchJob's ``spec`` (pytorch_types.go, ``PyTorchJobSpec``)
PYTORCHJOB_FIELDS = {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"}
#: the pod and container fields the manifests use (Kubernetes core/v1)
POD_FIELDS = {"containers", "volumes", "terminationGracePeriodSeconds", "nodeSelector", "tolerations"}
CONTAINER_FIELDS = {"name", "image", "workingDir", "command", "args", "env", "resources", "volumeMounts"}


def _documents(name: str) -> dict[str, dict[str, Any]]:
    """The YAML documents of ``docs/k8s/<name>`` by kind."""
    with open(K8S / name) as f:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(f)}


def _trainjob() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = _documents("trainjob.yaml")
    return docs["ClusterTrainingRuntime"], docs["TrainJob"]


def _pytorchjob() -> dict[str, Any]:
    return _documents("pytorchjob.yaml")["PyTorchJob"]


def _check_pod(pod: dict[str, Any], container_name: str) -> dict[str, Any]:
    assert set(pod) <= POD_FIELDS, set(pod) - POD_FIELDS
    (container,) = pod["containers"]
    assert set(container) <= CONTAINER_FIELDS, set(container) - CONTAINER_FIELDS
    assert container["name"] == container_name  # how the operator finds the container it sets PET_* in
    mounts = {mount["name"] for mount in container.get("volumeMounts", ())}
    assert mounts <= {volume["name"] for volume in pod.get("volumes", ())}
    return dict(container)


def trainjob_pod_env(job: str, num_nodes: int, nproc_per_node: int, node: int) -> dict[str, str]:
    """What Kubeflow Trainer v2's torch plugin sets in node ``node``'s pod (nothing else launcher-related)."""
    return {
        "PET_NNODES": str(num_nodes),
        "PET_NPROC_PER_NODE": str(nproc_per_node),
        "PET_NODE_RANK": str(node),  # the Job completion index
        "PET_MASTER_ADDR": f"{job}-node-0-0.{job}",
        "PET_MASTER_PORT": "29500",
    }


def pytorchjob_pod_env(
    job: str, workers: int, nproc_per_node: str | None, replica: str, index: int, master: str = "", port: int = 23456
) -> dict[str, str]:
    """What the training-operator sets in a PyTorchJob pod (one Master, ``workers`` Workers): ``RANK`` is the pod's
    index (Workers count from 1), ``WORLD_SIZE`` pods x ``nprocPerNode`` (1 unless an integer)."""
    pods = 1 + workers
    rank = index + (1 if replica == "Worker" else 0)
    master = master or f"{job}-master-0"
    env = {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": str(port),
        "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": master,
        "PET_MASTER_ADDR": master,
        "WORLD_SIZE": str(pods * (int(nproc_per_node) if (nproc_per_node or "").isdigit() else 1)),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NNODES": str(pods),
    }
    if nproc_per_node is not None:
        env["PET_NPROC_PER_NODE"] = nproc_per_node
    return env


def _torchrun_config(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], args: list[str]) -> Any:
    """torchrun's launch configuration for ``args`` in a pod with ``env`` (it reads ``PET_<ARG>`` as ``--arg``)."""
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun sets it when unset; the test must not leave it behind
    parsed = torchrun.get_args_parser().parse_args(args)  # the parser reads the environment when it is built
    config, _, _ = torchrun.config_from_args(parsed)
    return config


# ------------------------------------------------------------------------------------------------ the manifests


def test_trainjob_names_the_fields_kubeflow_trainer_reads() -> None:
    runtime, job = _trainjob()
    assert runtime["apiVersion"] == job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]  # kind defaults to ClusterTrainingRuntime
    assert "torch" in runtime["spec"]["mlPolicy"]  # the torch plugin: PET_* and torchrun
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    assert node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    _check_pod(node["template"]["spec"]["template"]["spec"], container_name="node")
    trainer = job["spec"]["trainer"]
    assert set(trainer) <= TRAINER_FIELDS, set(trainer) - TRAINER_FIELDS
    assert isinstance(trainer["numProcPerNode"], int)  # an int32 since Trainer 2.2 ("auto" counts GPUs only)
    assert trainer["numProcPerNode"] == trainer["resourcesPerNode"]["limits"][GAUDI] == 8
    assert trainer["numNodes"] == 2
    env = {var["name"]: var["value"] for var in trainer["env"]}
    assert not any(name.startswith("PET_") for name in env)  # Kubeflow refuses its reserved names
    assert env["LIGHTNING_GAUDI_RUN_ID"] == job["metadata"]["name"]  # one run folder, the same after a restart


def test_pytorchjob_names_the_fields_the_training_operator_reads() -> None:
    job = _pytorchjob()
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    spec = job["spec"]
    assert set(spec) <= PYTORCHJOB_FIELDS, set(spec) - PYTORCHJOB_FIELDS
    assert isinstance(spec["nprocPerNode"], str)  # a string in the API (*string)
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1
    for replica in replicas.values():
        assert replica["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        container = _check_pod(replica["template"]["spec"], container_name="pytorch")
        assert container["resources"]["limits"][GAUDI] == int(spec["nprocPerNode"]) == 8
    containers = [_check_pod(r["template"]["spec"], "pytorch") for r in replicas.values()]
    assert all(c == containers[0] for c in containers)  # every pod runs the same command


def test_the_image_is_intels_with_this_repository_where_the_manifests_run() -> None:
    lines = (K8S / "Dockerfile").read_text().splitlines()
    base = next(line.split()[1] for line in lines if line.startswith("FROM "))
    assert base.startswith("vault.habana.ai/gaudi-docker/")
    assert "/habanalabs/pytorch-installer-" in base
    assert f"WORKDIR {IMAGE_ROOT}" in lines
    runtime, _ = _trainjob()
    images = [runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]]
    images += [r["template"]["spec"] for r in _pytorchjob()["spec"]["pytorchReplicaSpecs"].values()]
    for pod in images:
        assert pod["containers"][0]["workingDir"].startswith(IMAGE_ROOT)


def _commands() -> list[tuple[str, list[str], Path]]:
    """(manifest, command + args, the working directory in this repository) of every container."""
    runtime, job = _trainjob()
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    workdir = pod["containers"][0]["workingDir"]
    found = [("trainjob.yaml", [*job["spec"]["trainer"]["command"], *job["spec"]["trainer"]["args"]], workdir)]
    for replica in _pytorchjob()["spec"]["pytorchReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        found.append(("pytorchjob.yaml", [*container["command"], *container["args"]], container["workingDir"]))
    return [(name, command, ROOT / Path(cwd).relative_to(IMAGE_ROOT)) for name, command, cwd in found]


@pytest.mark.parametrize(("manifest", "command", "cwd"), _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_command_is_torchrun_on_something_this_repository_has(manifest: str, command: list[str], cwd: Path) -> None:
    assert command[0] == "torchrun", f"{manifest}: Kubeflow's PET_* variables are torchrun's settings"
    args = torchrun.get_args_parser().parse_args(command[1:])
    assert (args.nnodes, args.nproc_per_node) == ("1:1", "1"), "sizes come from PET_*: keep them out of the command"
    if args.no_python:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        assert args.training_script in scripts
    elif args.module:
        assert importlib.util.find_spec(args.training_script) is not None
    else:
        assert (cwd / args.training_script).is_file(), f"{manifest}: {args.training_script} is not in {cwd}"


def test_the_hydra_app_overrides_compose_to_the_jobs_layout() -> None:
    _, job = _trainjob()
    trainer = job["spec"]["trainer"]
    assert trainer["args"][0] == "examples/train.py"
    cfg = compose_train(trainer["args"][1:])
    assert cfg.strategy._target_ == "lightning_gaudi.HPUParallelStrategy"
    assert cfg.trainer.devices == trainer["numProcPerNode"]
    assert cfg.trainer.num_nodes == trainer["numNodes"]


def test_the_cli_arguments_parse_to_the_jobs_layout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _pytorchjob()["spec"]
    _, command, cwd = next(c for c in _commands() if c[0] == "pytorchjob.yaml")
    args = torchrun.get_args_parser().parse_args(command[1:])
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the working directory on it, as python -m does
    monkeypatch.setattr(sys, "argv", ["lightning-gaudi"])  # no pytest arguments: the CLI gets the manifest's only
    with pytest.raises(SystemExit) as exited:
        cli_main([*args.training_script_args, "--print_config"])
    assert exited.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["trainer"]["strategy"] == "hpu_parallel"
    assert int(config["trainer"]["devices"]) == int(spec["nprocPerNode"])
    assert config["trainer"]["num_nodes"] == len(spec["pytorchReplicaSpecs"]) == 2
    assert config["ckpt_path"] == "auto"
    (checkpoint,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert checkpoint["init_args"]["dirpath"].startswith(config["trainer"]["default_root_dir"])


def test_trainjob_pods_give_torchrun_the_jobs_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    _, job = _trainjob()
    trainer, name = job["spec"]["trainer"], job["metadata"]["name"]
    env = trainjob_pod_env(name, trainer["numNodes"], trainer["numProcPerNode"], node=1)
    config = _torchrun_config(monkeypatch, env, trainer["args"])
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 8)
    assert config.rdzv_backend == "static"
    assert config.rdzv_configs["rank"] == 1
    assert config.rdzv_endpoint == f"{name}-node-0-0.{name}:29500"


def test_pytorchjob_pods_give_torchrun_the_jobs_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _pytorchjob()
    spec, name = job["spec"], job["metadata"]["name"]
    workers = spec["pytorchReplicaSpecs"]["Worker"]["replicas"]
    (_, command, _) = next(c for c in _commands() if c[0] == "pytorchjob.yaml")
    env = pytorchjob_pod_env(name, workers, spec["nprocPerNode"], "Worker", index=0)
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "16")  # the pod's index and size: torchrun's workers get their own
    config = _torchrun_config(monkeypatch, env, command[1:])
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 8)
    assert config.rdzv_configs["rank"] == 1
    assert config.rdzv_endpoint == f"{name}-master-0:23456"


# ------------------------------------------------------------------------------------- the pods' launch, for real


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 2-node job launched by torchrun's own arguments (shared with test_reliability.py)."""
    return run_once(tmp_path_factory, "two-nodes", two_node_job)


@pytest.mark.subprocess
def test_two_pytorchjob_pods_on_loopback_train_as_torchrun_does(tmp_path: Path, two_node_run: Path) -> None:
    """A Master and a Worker pod (1 process each) as the training-operator sets them up: ``torchrun`` without
    arguments, everything from ``PET_*``; the pods' own ``RANK``/``WORLD_SIZE`` must not reach the ranks."""
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", str(FIT), str(tmp_path / "job"), "--max-steps", "10"]
    envs = [
        loopback_env(**pytorchjob_pod_env("job", 1, "1", replica, 0, master="127.0.0.1", port=port))
        for replica in ("Master", "Worker")
    ]
    codes, log = run_nodes(tmp_path / "job", [command, command], envs)
    assert codes == [0, 0], log[-6000:]
    out = tmp_path / "job"
    for rank in range(2):
        assert (out / f"environment-rank{rank}.txt").read_text().split()[0] == "TorchElasticEnvironment"
        steps = (out / f"steps-rank{rank}.txt").read_text().split()[1::2]
        assert steps == [str(step) for step in range(1, 11)]
        final, expected = torch.load(out / f"final-rank{rank}.pt"), torch.load(two_node_run / f"final-rank{rank}.pt")
        assert final.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(final[key], value), f"rank {rank}: {key} differs from the torchrun launch"
    for key, value in elastic_fit.reference_weights(10).items():
        torch.testing.assert_close(final[key], value, rtol=0, atol=1e-5)


def kubeflow_auto_num_proc_per_node(resources: dict[str, dict[str, Any]]) -> int:
    """What Trainer v2 (2.1 and later) makes of ``numProcPerNode: auto``: the count of a resource whose name contains
    ``gpu``, else the pod's CPU request (else its limit), at least 1."""
    for kind in ("requests", "limits"):
        gpus = [int(v) for name, v in resources.get(kind, {}).items() if "gpu" in name.lower()]
        if gpus:
            return gpus[0]
    cpus = resources.get("requests", {}).get("cpu") or resources.get("limits", {}).get("cpu") or 0
    return max(1, int(cpus))


def test_num_proc_per_node_auto_counts_gpus_only() -> None:
    assert kubeflow_auto_num_proc_per_node({"limits": {"nvidia.com/gpu": 8, "cpu": 64}}) == 8
    assert kubeflow_auto_num_proc_per_node({"limits": {GAUDI: 8}, "requests": {"cpu": 64}}) == 64


@pytest.mark.subprocess
def test_num_proc_per_node_auto_on_a_gaudi_pod_is_named(tmp_path: Path) -> None:
    """A TrainJob left at ``numProcPerNode: auto``: Kubeflow gives torchrun the pod's CPU count (2 here), the node has
    1 card; every rank fails at ``Trainer(...)`` naming the setting, before training."""
    resources = {"limits": {GAUDI: 1, "cpu": 2}}
    env = trainjob_pod_env("job", 1, kubeflow_auto_num_proc_per_node(resources), 0)
    env.update({"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()), hpu.DEVICES_ENV: "1"})
    command = [sys.executable, "-m", "torch.distributed.run", str(FIT), str(tmp_path / "job")]
    command += ["--num-nodes", "1", "--devices", "1"]
    codes, log = run_nodes(tmp_path / "job", [command], [loopback_env(**env)])
    assert codes != [0], log[-4000:]
    assert "The launcher starts 2 processes on this node (LOCAL_WORLD_SIZE=2), but the node has 1 HPUs" in log, log[
        -4000:
    ]
    assert "numProcPerNode: auto (Kubeflow) and torchrun --nproc-per-node auto count GPUs only" in log
    assert not (tmp_path / "job" / "steps-rank0.txt").exists()  # refused before training
