"""A real 2-process ``hpu_parallel`` fit in compile mode (eager emulation, gloo, aot_eager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV, COMPILE_ENV

HELPERS_DIR = Path(__file__).parents[1] / "helpers"
STEPS = 3


@pytest.mark.subprocess
def test_two_process_compile_mode_ends_with_equal_weights(tmp_path: Path) -> None:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:  # a fresh launch: Lightning picks a free port
        env.pop(name, None)
    env.update({hpu.EMULATE_ENV: "eager", COMPILE_ENV: "1", COMPILE_BACKEND_ENV: "aot_eager"})
    command = [sys.executable, str(HELPERS_DIR / "ddp_compile_fit.py"), str(tmp_path), "1", str(STEPS)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, facts in enumerate(ranks):
        assert facts["global_rank"] == rank
        assert facts["world_size"] == 2
        assert facts["steps"] == STEPS
        assert facts["compile_callbacks"] == 1, "compile mode: the strategy added HPUCompile"
        assert facts["compiled_modules"] == ["model"]
        summary = facts["summary"]
        assert summary["mode"] == "compile"
        assert summary["compiled_graphs"] >= 1, "the model ran compiled inside DDP's forward"
        assert summary["graph_compilations_after_warmup"] == 0
        assert summary["graph_breaks"] == {}
        assert not [name for name in facts["names"] if "_orig_mod" in name]
    for name, initial in ranks[0]["initial"].items():
        first, second = torch.tensor(ranks[0]["final"][name]), torch.tensor(ranks[1]["final"][name])
        assert torch.equal(first, second), f"{name} differs between the ranks"
        assert torch.equal(torch.tensor(initial), torch.tensor(ranks[1]["initial"][name]))
    moved = [
        n
        for n in ranks[0]["initial"]
        if not torch.equal(torch.tensor(ranks[0]["initial"][n]), torch.tensor(ranks[0]["final"][n]))
    ]
    assert moved, "training changed the weights"
