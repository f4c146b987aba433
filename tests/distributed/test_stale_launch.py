"""The launch variables an in-process launch left (a 1-device Fabric launch) are not taken for an external
launcher's: a later 2-device Trainer in the same process is refused naming that launch while its group lives, and
gets a 2-process group of its own once it is gone. One process tries both in turn (``helpers/stale_launch.py``): a
refusal changes nothing (it is raised before any variable or record is touched), so the second Trainer meets what one
after ``destroy_process_group`` alone would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.shared_job import run_once

from lightning_gaudi import hpu

SCRIPT = Path(__file__).parents[1] / "helpers" / "stale_launch.py"
_LAUNCH = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")


def _refused_then_destroyed(out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH and not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env[hpu.EMULATE_ENV] = "eager"
    out.mkdir(parents=True)
    command = [sys.executable, str(SCRIPT), str(out)]
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=120)
    (out / "job.json").write_text(json.dumps({"returncode": proc.returncode, "stderr": proc.stderr}))


def _job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = run_once(tmp_path_factory, "stale-launch", _refused_then_destroyed)
    return out, json.loads((out / "job.json").read_text())


@pytest.mark.subprocess
def test_a_trainer_after_a_one_device_fabric_launch_is_refused_naming_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out, job = _job(tmp_path_factory)
    assert (out / "refused.txt").exists(), str(job["stderr"])[-3000:]
    refused = (out / "refused.txt").read_text()
    assert "an earlier launch in this process (HPUParallelStrategy, 1 process(es)) left its process group" in refused
    assert "The launcher says" not in refused
    assert refused.endswith("rank files: []\n")  # no rank trained


@pytest.mark.subprocess
def test_once_the_earlier_group_is_gone_the_trainer_gets_a_group_of_its_own_size(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out, job = _job(tmp_path_factory)
    assert job["returncode"] == 0, str(job["stderr"])[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"world_size": 2, "group": 2}] * 2
