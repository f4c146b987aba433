"""A 2-process ``hpu_parallel`` fit whose training step all-reduces with ``ReduceOp.AVG``, which HCCL does not have,
for ``tests/strategies/test_parallel_emulated.py``.

Run as ``python avg_step_fit.py`` with ``LIGHTNING_GAUDI_EMULATE=eager``: the fit must fail in its first step with
HCCL's error, as it would on a Gaudi (gloo alone would average).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch import Trainer
from models import RegressionModel, regression_loader, trainer_kwargs

from lightning_gaudi import HPUParallelStrategy


class AveragesItsLoss(RegressionModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        dist.all_reduce(loss.detach().clone(), op=dist.ReduceOp.AVG)
        return loss


if __name__ == "__main__":
    trainer = Trainer(
        accelerator="hpu", devices=2, strategy=HPUParallelStrategy(timeout=60), **trainer_kwargs(max_steps=2)
    )
    trainer.fit(AveragesItsLoss(), regression_loader())
