"""A 2-process ``hpu_parallel`` fit in which rank 1 drops its connections before its third forward, as a dying
process does, for ``tests/distributed/test_forward_faults.py``.

Run as ``python forward_peer_lost.py`` with ``LIGHTNING_GAUDI_EMULATE=eager``. The model has a batch norm, so DDP
broadcasts its buffers from rank 0 at the start of every forward: rank 0's next collective is inside DDP's forward,
which must fail as a ``PeerLostError`` naming the forward rather than as gloo's raw error.

Rank 1 shuts its sockets down and stays alive until rank 0 has ended: had it exited, Lightning's child-process
observer in rank 0 (it looks every 5 s) could kill rank 0 before the error is printed, on a loaded machine.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
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
            _drop_connections_then_exit()


def _drop_connections_then_exit() -> None:
    """Shut every TCP socket of this process down (the peers read end of file, as from a dead process); exit 3 once
    the parent (rank 0) is gone, or after 60 s."""
    parent = os.getppid()
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # a listening or already closed socket
        finally:
            sock.detach()  # the descriptor stays open: only the connection ends
    deadline = time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(3)


if __name__ == "__main__":
    trainer = Trainer(
        accelerator="hpu",
        devices=2,
        strategy=HPUParallelStrategy(timeout=30, broadcast_buffers=True),
        **trainer_kwargs(max_steps=6),
    )
    trainer.fit(WithBuffers(), regression_loader())
