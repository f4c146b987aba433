"""A 2-card job whose rank 1 does something at the end, for ``tests/distributed/test_exit_status.py``.

``python exit_fit.py OUT_DIR HOW [--fabric] [--torchrun]`` with ``LIGHTNING_GAUDI_EXIT_TIMEOUT`` as the test sets it:
a Trainer (``--fabric``: Fabric) trains 2 steps under ``hpu_parallel`` on 2 emulated cards (Lightning's launcher
starts rank 1; ``--torchrun``: torchrun starts both), then rank 1 does HOW:

- ``none``: nothing; ``linger``: sleeps 120 s after ``fit`` (still working); ``train_end``: raises in ``on_train_end``
  (Trainer only); ``teardown``: raises in ``teardown``; ``exit3``: ``sys.exit(3)`` after ``fit``; ``raise``: an
  uncaught error after ``fit``; ``sigkill``: kills itself with SIGKILL after ``fit``.

Each rank writes ``OUT_DIR/rank<r>.pid`` at the start and ``OUT_DIR/rank<r>.fitted`` (the time) when ``fit`` ended.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.pytorch import Trainer

sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))
from models import RegressionModel, regression_loader, trainer_kwargs

import lightning_gaudi  # noqa: F401  # registers the HPU strategies

OUT, HOW = Path(sys.argv[1]), sys.argv[2]
RANK = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class FailingAtTheEnd(RegressionModel):
    def on_train_end(self) -> None:
        if self.global_rank == 1 and HOW == "train_end":
            raise RuntimeError("rank 1 failed in on_train_end")

    def teardown(self, stage: str) -> None:
        if self.global_rank == 1 and HOW == "teardown":
            raise RuntimeError("rank 1 failed in teardown")


def fit_with_trainer() -> None:
    trainer = Trainer(accelerator="hpu", devices=2, strategy="hpu_parallel", **trainer_kwargs())
    trainer.fit(FailingAtTheEnd(), regression_loader())


def fit_with_fabric() -> None:
    fabric = Fabric(accelerator="hpu", devices=2, strategy="hpu_parallel")
    fabric.launch()
    module = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    for _ in range(2):
        fabric.backward(model(torch.randn(8, 4, device=fabric.device)).sum())
        optimizer.step()
        optimizer.zero_grad()
    if fabric.global_rank == 1 and HOW == "teardown":
        raise RuntimeError("rank 1 failed at the end")
    fabric.barrier()


def main() -> None:
    (OUT / f"rank{RANK}.pid").write_text(str(os.getpid()))
    fit_with_fabric() if "--fabric" in sys.argv else fit_with_trainer()
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    (OUT / f"rank{rank}.fitted").write_text(str(time.time()))
    if rank != 1:
        return
    actions: dict[str, Any] = {
        "linger": lambda: time.sleep(120),
        "exit3": lambda: sys.exit(3),
        "sigkill": lambda: os.kill(os.getpid(), signal.SIGKILL),
    }
    if HOW == "raise":
        raise RuntimeError("rank 1 failed after fit")
    actions.get(HOW, lambda: None)()


if __name__ == "__main__":
    main()
