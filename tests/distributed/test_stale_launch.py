"""The launch variables an in-process launch left (a 1-device Fabric launch) are not taken for an external
launcher's: a later 2-device Trainer in the same process is refused naming that launch while its group lives, and
gets a 2-process group of its own once it is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_gaudi import hpu

SCRIPT = Path(__file__).parents[1] / "helpers" / "stale_launch.py"
_LAUNCH = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH and not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env[hpu.EMULATE_ENV] = "eager"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SCRIPT), str(out), *args]
    return subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.subprocess
def test_a_trainer_after_a_one_device_fabric_launch_is_refused_naming_it(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode != 0
    assert (
        "an earlier launch in this process (HPUParallelStrategy, 1 process(es)) left its process group" in proc.stderr
    )
    assert "The launcher says" not in proc.stderr
    assert not list(tmp_path.glob("rank*.json"))  # no rank trained


@pytest.mark.subprocess
def test_once_the_earlier_group_is_gone_the_trainer_gets_a_group_of_its_own_size(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--destroy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"world_size": 2, "group": 2}] * 2
