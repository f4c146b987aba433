"""Checkpoints of every kind of optimizer under the sharding strategies (tests/strategies/test_optimizer_saves.py).

:func:`run_cases` runs at the end of ``fsdp_fit.py``'s job, every case in its 2 processes and process group. For each
strategy, each optimizer (``sgd``: SGD without momentum, which keeps no state; ``momentum``; ``adamw``) and each model
(``odd``: an 8-16-1 tanh MLP, 161 parameters; ``even``: 8-16-2, 178), each rank training on its own constant sample: 5
steps with a checkpoint after the 5th, then a resume from it to step 7. Rank r writes ``OUT/rank<r>.json``: each case's
``"ok"`` or its error.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from models import trainer_kwargs
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

import lightning_gaudi  # noqa: F401  # registers the strategies

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.0),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
}
OUTPUTS = {"odd": 1, "even": 2}


class ConstantSample(Dataset):
    def __init__(self, rank: int, outputs: int) -> None:
        self.x = torch.full((8,), 0.1 * (rank + 1))
        self.y = torch.full((outputs,), float(rank))

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


class Net(LightningModule):
    def __init__(self, optimizer: str, outputs: int, fully_sharded: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, outputs))
        self.optimizer, self.outputs, self.fully_sharded = optimizer, outputs, fully_sharded

    def configure_model(self) -> None:
        if self.fully_sharded:  # hpu_model_parallel: FSDP2 over the data-parallel dimension
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return OPTIMIZERS[self.optimizer](self.parameters())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(ConstantSample(self.global_rank, self.outputs), batch_size=4)


def fit(out: Path, strategy: str, optimizer: str, model: str, steps: int, ckpt_path: str | None) -> Trainer:
    seed_everything(0, verbose=False)
    net = Net(optimizer, OUTPUTS[model], strategy == "hpu_model_parallel")
    checkpoint = ModelCheckpoint(dirpath=out, every_n_train_steps=5, save_top_k=-1)
    kwargs = trainer_kwargs(max_steps=steps, enable_checkpointing=True, use_distributed_sampler=False)
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=2, callbacks=[checkpoint], **kwargs)
    trainer.fit(net, ckpt_path=ckpt_path)
    return trainer


def run_cases(out: Path, strategies: list[str], optimizers: list[str], models: list[str]) -> None:
    """Every case in turn, in this process and its process group; each rank's results in ``out/rank<r>.json``."""
    results: dict[str, Any] = {}
    rank = 0
    for strategy in strategies:
        for optimizer in optimizers:
            for model in models:
                case = f"{strategy}/{optimizer}/{model}"
                folder = out / case.replace("/", "-")
                try:
                    trainer = fit(folder, strategy, optimizer, model, 5, None)
                    rank = trainer.global_rank
                    trainer = fit(folder, strategy, optimizer, model, 7, str(folder / "epoch=0-step=5.ckpt"))
                    results[case] = "ok" if trainer.global_step == 7 else f"resumed to step {trainer.global_step}"
                except Exception as error:  # every case is reported; the next one runs in the same processes
                    results[case] = f"{type(error).__name__}: {error}"[:600]
                    traceback.print_exc()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
