"""``examples/hf_lora.py``, a PEFT LoRA fine-tune of a Hugging Face LLaMA written for GPUs (it never imports
lightning_gaudi), run through ``python -m lightning_gaudi`` on 2 emulated HPUs, equals the same script on 2 CPUs with
stock Lightning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_gaudi import hpu

pytest.importorskip("peft", reason="examples/hf_lora.py needs peft (the dev extra installs it)")
EXAMPLE = Path(__file__).parents[2] / "examples" / "hf_lora.py"


def _run(out: Path, *args: str, emulate: bool) -> dict:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:
        env.pop(name, None)
    if emulate:
        env[hpu.EMULATE_ENV] = "eager"
    command = [sys.executable, *args, "--devices", "2", "--steps", "4", "--out", str(out)]
    proc = subprocess.run(command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "lora.pt")


@pytest.mark.subprocess
def test_lora_finetune_through_python_m_lightning_gaudi_equals_stock_ddp_on_the_cpu(tmp_path: Path) -> None:
    on_hpu = _run(tmp_path / "hpu", "-m", "lightning_gaudi", str(EXAMPLE), emulate=True)
    on_cpu = _run(tmp_path / "cpu", str(EXAMPLE), "--accelerator", "cpu", emulate=False)
    assert on_hpu["strategy"] == "HPUParallelStrategy"
    assert on_cpu["strategy"] == "DDPStrategy"
    assert on_hpu["lora"].keys() == on_cpu["lora"].keys()
    assert len(on_hpu["lora"]) == 8  # A and B of q_proj and v_proj in 2 layers
    for name, weight in on_cpu["lora"].items():
        torch.testing.assert_close(on_hpu["lora"][name], weight, rtol=0, atol=1e-6)
    assert any(weight.abs().sum() > 0 for name, weight in on_hpu["lora"].items() if "lora_B" in name)  # it trained
