"""A fit that trains until it is preempted, for ``tests/callbacks/test_preemption.py``.

``python preempt_fit.py OUT_DIR [--devices N] [--grace S] [--slow-save S] [--step-sleep S] [--torchrun]`` with
``LIGHTNING_GAUDI_EMULATE=eager``. With 2 devices Lightning's popen launcher re-runs this script for rank 1 (under
``--torchrun`` torchrun starts both). Each rank writes ``OUT_DIR/rank<r>.pid`` when training starts and
``OUT_DIR/rank<r>.step`` (its global step) after every batch (the callbacks' batch-end hooks run first, so a
checkpoint saved there is one step later) and ``OUT_DIR/rank<r>.ended`` (the time) when ``fit`` returns or raises.
Checkpoints go to ``OUT_DIR/ckpt`` (the ``ModelCheckpoint`` folder, which saves nothing by itself here), or to
``--ckpt-dir``.
``--strategy NAME`` trains with another strategy (``hpu_fsdp``, ``hpu_deepspeed_stage_2``). ``--slow-after N
--slow-factor F`` makes every step from global step N on take F times ``--step-sleep``. ``--slow-save S`` makes
pickling the checkpoint take S seconds (the temporary file is open by then), for a grace period that runs out during
the save. ``--restart-counts A,B`` gives rank r the r-th value as ``TORCHELASTIC_RESTART_COUNT``: what two nodes'
torchrun agents give their ranks after a restart that one counted as a failure and the other as a membership change.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))
from models import RegressionModel, regression_loader, trainer_kwargs

from lightning_gaudi import HPUParallelStrategy, SingleHPUStrategy
from lightning_gaudi.callbacks import PreemptionCheckpoint


class SlowPickle:
    """Takes ``seconds`` to pickle (and unpickles to 0)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        time.sleep(self.seconds)
        return (int, (0,))


class Preemptible(RegressionModel):
    def __init__(self, out: Path, step_sleep: float, slow_save: float, slow_after: int, slow_factor: float) -> None:
        super().__init__()
        self.out = out
        self.step_sleep = step_sleep
        self.slow_save = slow_save
        self.slow_after = slow_after
        self.slow_factor = slow_factor

    def on_train_start(self) -> None:
        (self.out / f"rank{self.global_rank}.pid").write_text(str(os.getpid()))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        slower = self.slow_factor if self.trainer.global_step >= self.slow_after else 1.0
        time.sleep(self.step_sleep * slower)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        (self.out / f"rank{self.global_rank}.step").write_text(str(self.trainer.global_step))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.slow_save:
            checkpoint["slow"] = SlowPickle(self.slow_save)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--slow-save", type=float, default=0.0)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--slow-after", type=int, default=1 << 62, help="from this step on, steps take longer")
    parser.add_argument("--slow-factor", type=float, default=1.0, help="... this many times longer")
    parser.add_argument("--torchrun", action="store_true")
    parser.add_argument("--strategy", default=None, help="a registered strategy name (default: hpu_parallel)")
    parser.add_argument("--disabled", action="store_true", help="PreemptionCheckpoint(enabled=False)")
    parser.add_argument("--restart-counts", default=None, help="TORCHELASTIC_RESTART_COUNT per rank, comma-separated")
    parser.add_argument("--ckpt-dir", type=Path, default=None, help="the checkpoint folder (default: OUT_DIR/ckpt)")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay after fit ends (the exit's work)")
    args = parser.parse_args()
    if args.restart_counts is not None:
        counts = args.restart_counts.split(",")
        os.environ["TORCHELASTIC_RESTART_COUNT"] = counts[int(os.environ.get("LOCAL_RANK", "0"))]
    seed_everything(0)
    strategy: Any = HPUParallelStrategy(timeout=60) if args.devices > 1 or args.torchrun else SingleHPUStrategy()
    if args.strategy is not None:
        strategy = args.strategy
    checkpoints = ModelCheckpoint(dirpath=args.ckpt_dir or args.out / "ckpt", save_top_k=0, save_last=False)
    kwargs = trainer_kwargs(max_steps=100_000, max_epochs=None, enable_checkpointing=True)
    trainer = Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=strategy,
        callbacks=[checkpoints, PreemptionCheckpoint(grace_period=args.grace, enabled=not args.disabled)],
        **kwargs,
    )
    try:
        model = Preemptible(args.out, args.step_sleep, args.slow_save, args.slow_after, args.slow_factor)
        trainer.fit(model, regression_loader())
    finally:
        (args.out / f"rank{trainer.global_rank}.ended").write_text(f"{time.time()}")
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
