"""A real 2-process ``hpu_fast_ddp`` fit under eager emulation, for ``tests/strategies/test_parallel_emulated.py``.

:func:`run` is one of the fits ``parallel_scenarios.py`` runs in its rank processes. Rank 1 starts from other weights
than rank 0 (the strategy must broadcast rank 0's). 4 optimizer steps of SGD, ``accumulate`` micro-batches of 4
samples each. Each rank writes ``OUT/rank<r>.json``: its weights when the fit starts and ends, its micro-batches, and
how many gradient all-reduces ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, Trainer, seed_everything
from models import RegressionModel, regression_loader, trainer_kwargs

import lightning_gaudi  # noqa: F401  (registers the names)

STEPS = 4


class Perturbed(RegressionModel):
    def setup(self, stage: str) -> None:
        if self.global_rank == 1:  # before the strategy sets up the model
            with torch.no_grad():
                for parameter in self.parameters():
                    parameter.add_(1.0)


class Probe(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.facts: dict[str, Any] = {"batches": [], "gradient_all_reduces": 0}
        self.original_all_reduce = dist.all_reduce

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts["initial"] = {k: v.tolist() for k, v in pl_module.state_dict().items()}
        self.facts["wrapper"] = type(trainer.strategy.model).__name__
        original = self.original_all_reduce
        gradients = sum(p.numel() for p in pl_module.parameters())

        def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == gradients:  # a flat buffer of every gradient
                self.facts["gradient_all_reduces"] += 1
            return original(tensor, *args, **kwargs)

        dist.all_reduce = counting  # type: ignore[assignment]

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.facts["batches"].append([tensor.tolist() for tensor in batch])

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts["final"] = {k: v.tolist() for k, v in pl_module.state_dict().items()}
        self.facts["steps"] = trainer.global_step
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.facts))

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        dist.all_reduce = self.original_all_reduce  # later fits in this process count nothing


def run(out: Path, accumulate: int) -> None:
    """One fit (a fresh seed, model, strategy, Trainer and loader), its facts in ``out/rank<r>.json``."""
    seed_everything(0, verbose=False)
    trainer = Trainer(
        accelerator="hpu",
        strategy="hpu_fast_ddp",
        devices=2,
        callbacks=[Probe(out)],
        accumulate_grad_batches=accumulate,
        **trainer_kwargs(max_steps=STEPS),
    )
    trainer.fit(Perturbed(), train_dataloaders=regression_loader(samples=64, batch_size=4))
