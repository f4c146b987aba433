"""A real 2-process Fabric loop on ``hpu_fast_ddp`` under eager emulation, for ``tests/fabric/test_fabric_ddp.py``.

Run as ``python fabric_fast_ddp.py OUT_DIR``: 4 optimizer steps of SGD, 2 micro-batches each (the first under
``fabric.no_backward_sync``); rank 1 starts from other weights. Each rank writes ``OUT_DIR/rank<r>.json``: its weights
after ``fabric.setup`` and after training, its micro-batches, and how many gradient all-reduces ran.
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

import lightning_gaudi  # noqa: F401 - registers the HPU strategies with Fabric

STEPS, ACCUMULATE, BATCH = 4, 2, 4


def main() -> None:
    out = Path(sys.argv[1])
    fabric = Fabric(accelerator="hpu", strategy="hpu_fast_ddp", devices=2)
    fabric.launch()
    seed_everything(0, verbose=False)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    if fabric.global_rank == 1:
        with torch.no_grad():
            for parameter in net.parameters():
                parameter.add_(1.0)
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    initial = {k: v.tolist() for k, v in model.state_dict().items()}
    total = sum(p.numel() for p in net.parameters())
    reduces = [0]
    original = dist.all_reduce

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduces[0] += tensor.numel() == total
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting  # type: ignore[assignment]
    x = torch.randn(STEPS * ACCUMULATE * 2 * BATCH, 4, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)
    batches: list[Any] = []
    for index, (inputs, targets) in enumerate(fabric.setup_dataloaders(data)):
        batches.append([inputs.tolist(), targets.tolist()])
        accumulating = (index + 1) % ACCUMULATE != 0
        with fabric.no_backward_sync(model, enabled=accumulating):
            fabric.backward(((model(inputs) - targets) ** 2).mean() / ACCUMULATE)
        if not accumulating:
            optimizer.step()
            optimizer.zero_grad()
    facts = {"initial": initial, "final": {k: v.tolist() for k, v in model.state_dict().items()}}
    facts.update(batches=batches, gradient_all_reduces=reduces[0])
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
