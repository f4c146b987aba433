"""Strategy objects as GPU code builds them train on 2 emulated HPUs exactly as the HPU strategies they map to: fit,
checkpoint, resume, validate, test and predict, Trainer and Fabric; meta-device models built with
``init_module(empty_init=True)`` under every sharded strategy equal the same model built normally
(``tests/helpers/gpu_objects_fabric.py``'s runs, then ``gpu_objects_fit.py``'s, in one 2-process job once per pytest
run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.shared_job import run_once
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import hpu

HELPERS_DIR = Path(__file__).parents[1] / "helpers"
TRAINER_KINDS = {
    "ddp": "HPUParallelStrategy",
    "fsdp": "HPUFSDPStrategy",
    "deepspeed": "HPUDeepSpeedStrategy",
    "model_parallel": "HPUModelParallelStrategy",
}
NO_DEEPSPEED = pytest.mark.skipif(
    not RequirementCache("deepspeed"), reason="DeepSpeed is not installed (scripts/setup.sh installs it)"
)


def _kinds(kinds: list[str]) -> list[Any]:
    return [pytest.param(kind, marks=NO_DEEPSPEED) if kind == "deepspeed" else kind for kind in kinds]


FABRIC_KINDS = {"ddp": "HPUParallelStrategy", "fsdp": "HPUFSDPStrategy", "model_parallel": "HPUModelParallelStrategy"}


def _job(out: Path) -> None:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    out.mkdir(parents=True)
    command = [sys.executable, str(HELPERS_DIR / "gpu_objects_fit.py"), str(out)]
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=600, check=False)
    (out / "stderr.txt").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = run_once(tmp_path_factory, "gpu-objects", _job)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = run_once(tmp_path_factory, "gpu-objects", _job)
    return [json.loads((out / "fabric" / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _same_run(name: dict[str, Any], adopted: dict[str, Any]) -> None:
    assert adopted["losses"] == name["losses"]
    for key in ("final", "eval"):
        if key in name:
            assert adopted[key] == name[key], key


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", _kinds(list(TRAINER_KINDS)))
def test_trainer_object_equals_its_hpu_strategy_through_fit_resume_and_evaluation(
    trainer_runs: list[dict[str, Any]], kind: str
) -> None:
    for rank in trainer_runs:
        runs = rank[kind]
        assert TRAINER_KINDS[kind] in runs["object"]["classes"]  # on the HPU strategy, not Lightning's alone
        assert runs["object"]["is_object_class"] is True  # and still of the class it was built as
        assert len(runs["object-first"]["losses"]) == len(runs["object"]["losses"]) == 2
        _same_run(runs["name-first"], runs["object-first"])
        _same_run(runs["name"], runs["object"])  # resumed from the object's own checkpoint
        assert len(runs["object"]["eval"]["predicted"]) == 8  # this rank's half of the 16 samples


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", _kinds(["fsdp", "deepspeed", "model_parallel"]))
def test_trainer_meta_device_model_equals_the_model_built_normally(
    trainer_runs: list[dict[str, Any]], kind: str
) -> None:
    for rank in trainer_runs:
        _same_run(rank[kind]["name-first"], rank[kind]["empty"])


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", list(FABRIC_KINDS))
def test_fabric_object_equals_its_hpu_strategy_through_save_load_and_evaluation(
    fabric_runs: list[dict[str, Any]], kind: str
) -> None:
    for rank in fabric_runs:
        runs = rank[kind]
        assert FABRIC_KINDS[kind] in runs["object"]["classes"]
        assert len(runs["object"]["losses"]) == 2
        _same_run(runs["name-first"], runs["object-first"])
        _same_run(runs["name"], runs["object"])
        assert torch.isfinite(torch.tensor(runs["object"]["eval"])).all()


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["fsdp", "model_parallel"])
def test_fabric_meta_device_model_equals_the_model_built_normally(fabric_runs: list[dict[str, Any]], kind: str) -> None:
    for rank in fabric_runs:
        assert rank[kind]["empty"]["losses"] == rank[kind]["name-first"]["losses"]
