"""``examples/fabric_train.py``: the example GPT in a Fabric loop, on the emulated HPU that ``configure()`` turns on."""

from __future__ import annotations

import math
import os
from pathlib import Path

import fabric_train  # examples/ is on pytest's path, as for the Hydra app's tests
import pytest
import torch

from lightning_gaudi import hpu

SMALL = ["--steps", "4", "--warmup-steps", "1", "--batch-size", "4", "--seq-len", "32", "--max-bytes", "40000"]


def test_example_trains_and_saves_a_cpu_checkpoint(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    results = fabric_train.main([*SMALL, "--val-batches", "2", "--log-every", "2", "--out", str(tmp_path)])
    assert os.environ[hpu.EMULATE_ENV] == "eager", "configure() turns on eager emulation without a Gaudi"
    assert math.isfinite(results["train_loss"])
    assert results["val_ppl"] < 200, "4 steps learn the bytes' frequencies: well below 256, a uniform guess"
    state = torch.load(tmp_path / "gpt.ckpt", map_location=None, weights_only=True)
    assert state["step"] == 4
    assert state["model"]["head.weight"].device.type == "cpu"
    torch.testing.assert_close(state["model"]["head.weight"], state["model"]["tok_emb.weight"])  # still tied
