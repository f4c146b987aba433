"""A real 2-process ``hpu_parallel`` fit with ``sync_batchnorm=True`` under eager emulation, for
``tests/strategies/test_parallel_emulated.py``.

:func:`run` is one of the fits ``parallel_scenarios.py`` runs in its rank processes. Buffers are not broadcast from
rank 0 (``forward_sync_buffers=False``; ``broadcast_buffers`` before torch 2.13), so the ranks' running statistics
agree only if the batch norm itself synchronizes them. Each rank writes ``OUT/rank<r>.json``: its batches, the batch
norm's class during and after the fit, and the weights and buffers before and after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor, nn

from lightning_gaudi import HPUParallelStrategy

#: DDP's switch for the buffer broadcast: ``forward_sync_buffers`` from torch 2.13 (which deprecates the old name),
#: ``broadcast_buffers`` before.
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in torch.nn.parallel.DistributedDataParallel.__init__.__code__.co_varnames
    else {"broadcast_buffers": False}
)


def make_bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))


class BNRegression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_bn_net()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _state(module: nn.Module) -> dict[str, Any]:
    return {name: tensor.detach().cpu().tolist() for name, tensor in module.state_dict().items()}


class Probe(Callback):
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {"batches": []}

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts.update(initial=_state(pl_module.net), bn_class_in_fit=type(pl_module.net[1]).__name__)

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.facts["batches"].append([tensor.tolist() for tensor in batch])


def run(out: Path, steps: int) -> None:
    """One fit (a fresh seed, model, strategy, Trainer and loader), its facts in ``out/rank<r>.json``."""
    from models import regression_loader, trainer_kwargs  # on sys.path in the rank processes, not in the tests

    seed_everything(0, verbose=False)
    model = BNRegression()
    probe = Probe()
    trainer = Trainer(
        accelerator="hpu",
        strategy=HPUParallelStrategy(**NO_BUFFER_SYNC),
        devices=2,
        sync_batchnorm=True,
        callbacks=[probe],
        **trainer_kwargs(max_steps=steps),
    )
    trainer.fit(model, train_dataloaders=regression_loader(samples=32, batch_size=4))
    probe.facts.update(
        final=_state(model.net),
        bn_class_after_fit=type(model.net[1]).__name__,
        layer_sync=type(trainer.strategy._layer_sync).__name__,
        steps=trainer.global_step,
    )
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(probe.facts))
