"""A 2-process ``hpu_parallel`` fit in which rank 1 dies before its third forward,
for ``tests/callbacks/test_preemption.py``.

Run as ``python forward_peer_lost.py`` with ``LIGHTNING_GAUDI_EMULATE=eager``. The model has a batch norm, so DDP
broadcasts its buffers from rank 0 at the start of every forward: rank 0's next collective is inside DDP's forward,
which must fail as a ``PeerLostError`` naming the forward rather than as gloo's raw error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))
from models import IN_FEATURES, RegressionModel, regression_loader, trainer_kwargs

from lightning_gaudi import HPUParallelStrategy


class WithBuffers(RegressionModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm1d(IN_FEATURES), nn.Linear(IN_FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 2 and self.global_rank == 1:
            os._exit(3)


if __name__ == "__main__":
    trainer = Trainer(
        accelerator="hpu",
        devices=2,
        strategy=HPUParallelStrategy(timeout=30, broadcast_buffers=True),
        **trainer_kwargs(max_steps=6),
    )
    trainer.fit(WithBuffers(), regression_loader())
