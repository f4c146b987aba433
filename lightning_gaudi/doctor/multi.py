"""The doctor's checks that start one process per card: ``python -m lightning_gaudi.doctor.multi allreduce DEVICES OUT``
(Fabric's all-reduce on the HPU strategy) and ``... fit STRATEGY DEVICES OUT`` (a short ``Trainer.fit``). Lightning's
launcher runs the same command for the other ranks; rank 0 writes the outcome to the JSON file ``OUT``."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

#: Steps of the short fit.
FIT_STEPS = 12


def _write(out: str, status: str, reason: str, figure: str) -> None:
    Path(out).write_text(json.dumps({"status": status, "reason": reason, "figure": figure}))


def all_reduce(devices: int, out: str) -> None:
    import torch
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="hpu", devices=devices, strategy="hpu_parallel")
    fabric.launch()
    numel = 4 * 2**20 // 4  # 4 MiB of float32
    tensor = torch.full((numel,), float(fabric.global_rank + 1), device=fabric.device)
    fabric.all_reduce(tensor.clone(), reduce_op="sum")  # the first call sets the communicator up
    repeats = 10
    copies = [tensor.clone() for _ in range(repeats)]  # the reduction is in place
    fabric.barrier()
    start = time.perf_counter()
    for copy in copies:
        total = fabric.all_reduce(copy, reduce_op="sum")
    value = float(total[0].cpu()) if isinstance(total, torch.Tensor) else math.nan
    seconds = (time.perf_counter() - start) / repeats
    expected = devices * (devices + 1) / 2
    if fabric.global_rank != 0:
        return
    backend = torch.distributed.get_backend()
    figure = f"{numel * 4 / seconds / 1e9:.2f} GB/s algorithm bandwidth, 4 MiB over {devices} processes ({backend})"
    if value != expected:
        _write(out, "fail", f"the sum over {devices} ranks was {value}, not {expected}", figure)
    else:
        _write(out, "pass", f"the sum over {devices} ranks is right", figure)


def _module(strategy: str) -> Any:
    import torch
    from lightning.pytorch import LightningModule
    from torch import nn

    class Regression(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
            self.losses: list[float] = []

        def configure_model(self) -> None:
            if strategy == "hpu_model_parallel":  # FSDP2 over the data-parallel dimension of the mesh
                from torch.distributed.fsdp import fully_shard

                assert self.device_mesh is not None
                mesh = self.device_mesh["data_parallel"]
                for layer in (self.net[0], self.net[2]):
                    fully_shard(layer, mesh=mesh)
                fully_shard(self.net, mesh=mesh)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.append(float(loss.detach().cpu()) if batch_idx in (0, FIT_STEPS - 1) else math.nan)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return Regression()


def fit(strategy: str, devices: int, out: str) -> None:
    import torch
    from lightning.pytorch import Trainer, seed_everything
    from torch.utils.data import DataLoader, TensorDataset

    seed_everything(0, verbose=False)
    x = torch.randn(FIT_STEPS * 16 * devices, 32)
    y = x[:, :1] * 2 - x[:, 1:2]
    trainer = Trainer(
        accelerator="hpu",
        devices=devices,
        strategy=strategy,
        max_steps=FIT_STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = _module(strategy)
    start = time.perf_counter()
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
    seconds = time.perf_counter() - start
    if trainer.global_rank != 0:
        return
    first, last = model.losses[0], model.losses[-1]
    figure = f"{FIT_STEPS} steps on {devices} card(s), {seconds:.2f} s with set-up, loss {first:.3f} -> {last:.3f}"
    if trainer.global_step != FIT_STEPS or not last < first:
        _write(out, "fail", f"{trainer.global_step} steps and the loss did not fall", figure)
    else:
        _write(out, "pass", f"{type(trainer.strategy).__name__} trains", figure)


def main(argv: list[str]) -> int:
    if argv[0] == "allreduce":
        all_reduce(int(argv[1]), argv[2])
    else:
        fit(argv[1], int(argv[2]), argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
