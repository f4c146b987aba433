"""A tiny ``hpu_parallel`` fit for the reliability tests, run once per rank by torchrun (or Lightning's launcher).

``python elastic_fit.py OUT_DIR [--num-nodes N] [--devices D] [--max-steps S] [--every S]
[--kill ATTEMPT:RANK:STEP ...] [--timeout SECONDS] [--hang-rank R] [--grace SECONDS]`` under
``LIGHTNING_GAUDI_EMULATE=eager``.

Every rank sees the same batch on every step (rank r always gets sample r), so the weights after ``n`` optimizer
steps depend on ``n`` alone: a run that loses steps or applies one twice ends with different weights than
:func:`reference_weights`. Checkpoints go to ``OUT_DIR/ckpt`` every ``--every`` steps (and ``last.ckpt``); each
attempt resumes with ``lightning_gaudi.resume.resolve_ckpt_path("auto", ...)``.

What each rank writes under ``OUT_DIR``:

- ``steps-rank<r>.txt``: one line ``<attempt> <global_step>`` after every optimizer step;
- ``resumed-rank<r>.txt``: one line ``<attempt> <global_step restored from the checkpoint, or 0>`` per attempt;
- ``environment-rank<r>.txt``: ``<Lightning's cluster environment class> <the launch's run id>``, one line per attempt;
- ``final-rank<r>.pt``: the weights at the end of a run that reached ``--max-steps``.

``--kill ATTEMPT:RANK:STEP`` (repeatable): rank RANK SIGKILLs itself after optimizer step STEP in attempt ATTEMPT (the
first is 0), so one job can lose a rank in several attempts in a row. ``--hang-rank R``: rank R stops answering (sleeps)
before the first barrier. ``--grace``: the ``PreemptionCheckpoint`` grace period (3 s; the default 25 s would keep a
hung rank alive that long after torchrun's SIGTERM, since it never reaches a step to stop at). An attempt is one start
of a rank's process that reached the training loop (torchrun's ``TORCHELASTIC_RESTART_COUNT`` cannot tell: a restart for
a peer's failure does not count there).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_gaudi import HPUParallelStrategy, resume
from lightning_gaudi.callbacks import PreemptionCheckpoint
from lightning_gaudi.distributed import LaunchEnvironment

FEATURES = 8
LR = 0.05
MOMENTUM = 0.9


def samples() -> tuple[Tensor, Tensor]:
    """Two fixed samples: rank ``r`` trains on sample ``r`` (repeated) on every step."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, FEATURES, generator=generator), torch.randn(2, 1, generator=generator)


class RankSample(Dataset):
    """Every index holds sample ``rank``, so each step of a rank sees the same batch (no distributed sampler)."""

    def __init__(self, rank: int, length: int = 32) -> None:
        x, y = samples()
        self.x, self.y = x[rank], y[rank]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.x, self.y


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def reference_weights(steps: int) -> dict[str, Tensor]:
    """The weights two ranks agree on after ``steps`` uninterrupted steps, computed in one process."""
    net = make_net()
    optimizer = make_optimizer(net.parameters())
    x, y = samples()
    for _ in range(steps):
        optimizer.zero_grad()
        # DDP averages the two ranks' gradients: the mean of the per-sample losses has the same gradient
        loss = (nn.functional.mse_loss(net(x[:1]), y[:1]) + nn.functional.mse_loss(net(x[1:]), y[1:])) / 2
        loss.backward()
        optimizer.step()
    return {f"net.{k}": v for k, v in net.state_dict().items()}


class TinyModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RankSample(self.global_rank % 2), batch_size=4)


class Recorder(Callback):
    def __init__(self, out: Path, attempt: int, args: argparse.Namespace) -> None:
        self.out = out
        self.attempt = attempt
        self.args = args

    def _append(self, name: str, trainer: Trainer, line: str) -> None:
        with open(self.out / f"{name}-rank{trainer.global_rank}.txt", "a") as f:
            f.write(line + "\n")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._append("resumed", trainer, f"{self.attempt} {trainer.global_step}")
        environment = type(trainer.strategy.cluster_environment).__name__
        self._append("environment", trainer, f"{environment} {LaunchEnvironment.from_env().run_id}")
        if self.args.hang_rank == trainer.global_rank:
            time.sleep(3600)  # alive but silent: the peers' next collective must time out
        trainer.strategy.barrier("recorder")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        step = trainer.global_step
        self._append("steps", trainer, f"{self.attempt} {step}")
        if (self.attempt, trainer.global_rank, step) in self.args.kill:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step == self.args.max_steps:
            torch.save(pl_module.state_dict(), self.out / f"final-rank{trainer.global_rank}.pt")


def _kill(text: str) -> tuple[int, int, int]:
    attempt, rank, step = map(int, text.split(":"))
    return attempt, rank, step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--kill", type=_kill, action="append", default=[], help="ATTEMPT:RANK:STEP, repeatable")
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--grace", type=float, default=3.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    resumed = args.out / f"resumed-rank{os.environ.get('RANK', '0')}.txt"
    attempt = len(resumed.read_text().splitlines()) if resumed.exists() else 0  # this rank's earlier starts
    ckpt_dir = args.out / "ckpt"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, filename="{step}", every_n_train_steps=args.every, save_top_k=-1, save_last=True
    )
    trainer = Trainer(
        accelerator="hpu",
        strategy=HPUParallelStrategy(timeout=timedelta(seconds=args.timeout)),
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=args.max_steps,
        callbacks=[checkpoint, Recorder(args.out, attempt, args), PreemptionCheckpoint(grace_period=args.grace)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(TinyModel(), ckpt_path=resume.resolve_ckpt_path("auto", ckpt_dir))


if __name__ == "__main__":
    main()
