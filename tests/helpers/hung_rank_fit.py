"""A 2-process ``hpu_parallel`` fit in which rank 0 fails while rank 1 hangs, for
``tests/strategies/test_parallel_emulated.py``.

Run as ``python hung_rank_fit.py OUT_DIR`` with ``LIGHTNING_GAUDI_EMULATE=eager``. Rank 1 writes its pid to
``OUT_DIR/rank1.pid`` and then sleeps in its second training step; in its own, rank 0 all-reduces its loss with
``ReduceOp.AVG``, which HCCL does not have: it must fail there with HCCL's error, as it would on a Gaudi (gloo alone
would average, or wait for rank 1).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Trainer
from models import RegressionModel, regression_loader, trainer_kwargs

from lightning_gaudi import HPUParallelStrategy


class FailingOrHanging(RegressionModel):
    def on_train_start(self) -> None:
        Path(sys.argv[1], f"rank{self.global_rank}.pid").write_text(str(os.getpid()))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1:
            if self.global_rank == 0:
                time.sleep(2)  # rank 1 is asleep by now
                dist.all_reduce(loss.detach().clone(), op=dist.ReduceOp.AVG)
            time.sleep(600)  # a rank stuck in the user's code, as a hung collective would be
        return loss


if __name__ == "__main__":
    trainer = Trainer(
        accelerator="hpu", devices=2, strategy=HPUParallelStrategy(timeout=120), **trainer_kwargs(max_steps=4)
    )
    trainer.fit(FailingOrHanging(), regression_loader())
