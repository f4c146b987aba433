"""A real 2-process Fabric loop on ``hpu_parallel`` with ``bf16-mixed`` under eager emulation (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_gaudi import hpu

HELPER = Path(__file__).parent / "fabric_ddp.py"
STEPS = 3
_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")


@pytest.mark.subprocess
def test_two_process_fabric_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in _LAUNCH_VARS:  # a fresh launch: Fabric picks a free port
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    proc = subprocess.run(
        [sys.executable, str(HELPER), str(tmp_path), str(STEPS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for rank in (0, 1):
        assert f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2 on HPU {rank}" in proc.stderr
    assert "HPUs: 2 per node x 1 node(s), GAUDI2 emulated on the CPU (eager mode), HCCL emulated over gloo" in (
        proc.stderr
    )
    assert "CUDA is not available" not in proc.stderr  # stock Fabric's bf16-mixed: CUDA autocast, disabled

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, facts in enumerate(ranks):
        assert facts["global_rank"] == rank
        assert facts["world_size"] == 2
        assert facts["device"] == "cpu"  # the emulated HPU
        assert facts["process_group_backend"] == "hccl"
        assert facts["strategy"] == "lightning_gaudi.fabric.parallel.HPUParallelStrategy"
        assert (facts["precision"], facts["autocast_device"]) == ("HPUPrecision", "cpu")
        assert facts["gradient_as_bucket_view"] is True
        assert facts["activations"] == ["torch.bfloat16"] * STEPS
        assert len(facts["batches"]) == STEPS
    assert ranks[0]["batches"] != ranks[1]["batches"], "each rank trains on its own share of the data"
    assert ranks[0]["final"] == ranks[1]["final"], "DDP keeps the ranks' weights equal"

    checkpoint = torch.load(tmp_path / "fabric.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["step"] == STEPS
    for name, tensor in checkpoint["model"].items():
        assert tensor.device.type == "cpu"
        assert tensor.dtype == torch.float32
        assert tensor.tolist() == ranks[0]["final"][name]
    assert sorted(os.listdir(tmp_path)) == ["fabric.ckpt", "rank0.json", "rank1.json"]  # no temporary left behind


@pytest.mark.subprocess
def test_fast_ddp_fabric_loop_equals_one_process_on_the_union(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in _LAUNCH_VARS:
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    helper = Path(__file__).parent / "fabric_fast_ddp.py"
    proc = subprocess.run(
        [sys.executable, str(helper), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["initial"] == ranks[1]["initial"], "rank 0's weights were not broadcast"
    assert [r["gradient_all_reduces"] for r in ranks] == [4, 4]  # once per optimizer step, not per micro-batch
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    net.load_state_dict({k: torch.tensor(v) for k, v in ranks[0]["initial"].items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    micro = list(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True))
    for step in range(4):
        optimizer.zero_grad()
        for (x0, y0), (x1, y1) in micro[2 * step : 2 * step + 2]:
            (((net(torch.tensor(x0 + x1)) - torch.tensor(y0 + y1)) ** 2).mean() / 2).backward()
        optimizer.step()
    for name, tensor in net.state_dict().items():
        torch.testing.assert_close(torch.tensor(ranks[0]["final"][name]), tensor, rtol=1e-5, atol=1e-6)
        assert ranks[0]["final"][name] == ranks[1]["final"][name]
