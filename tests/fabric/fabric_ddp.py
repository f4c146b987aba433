"""A real 2-process Fabric loop on ``hpu_parallel`` under eager emulation, for ``tests/fabric/test_fabric_ddp.py``.

Run as ``python fabric_ddp.py OUT_DIR STEPS`` with ``LIGHTNING_GAUDI_EMULATE=eager``. Fabric's popen launcher re-runs
this script for rank 1. Each rank trains a small regression net with ``precision="bf16-mixed"``, saves one checkpoint
with ``fabric.save`` (rank 0 writes it) and writes ``OUT_DIR/rank<r>.json``: what it ran on, the dtype of the first
layer's output under autocast, the batches it saw and its weights after training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric import Fabric, seed_everything
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import lightning_gaudi  # noqa: F401 - registers "hpu" and the HPU strategies with Fabric

BATCH = 4
FEATURES = 4


def main() -> None:
    out = Path(sys.argv[1])
    steps = int(sys.argv[2])
    fabric = Fabric(accelerator="hpu", strategy="hpu_parallel", devices=2, precision="bf16-mixed")
    fabric.launch()
    seed_everything(0, verbose=False)
    net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 2 * BATCH, FEATURES, generator=generator)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=BATCH))

    activations: list[str] = []
    net[0].register_forward_hook(lambda module, args, output: activations.append(str(output.dtype)))
    batches: list[Any] = []
    for inputs, targets in loader:
        batches.append(inputs.tolist())
        loss = ((model(inputs) - targets) ** 2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    fabric.save(out / "fabric.ckpt", {"model": model, "optimizer": optimizer, "step": len(batches)})
    ddp = model._forward_module
    assert isinstance(ddp, DistributedDataParallel), type(ddp)
    facts = {
        "global_rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "device": str(fabric.device),
        "process_group_backend": dist.get_backend(),
        "strategy": f"{type(fabric.strategy).__module__}.{type(fabric.strategy).__qualname__}",
        "precision": type(fabric.strategy.precision).__qualname__,
        "autocast_device": fabric.strategy.precision.device,
        "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
        "activations": activations,
        "batches": batches,
        "final": {name: tensor.detach().cpu().tolist() for name, tensor in net.state_dict().items()},
    }
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
