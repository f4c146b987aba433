"""A real 2-process ``hpu_deepspeed`` fit under eager emulation, for ``tests/strategies/test_deepspeed_emulated.py``.

Run as ``python deepspeed_fit.py OUT_DIR STRATEGY MODE [CKPT]`` with ``LIGHTNING_GAUDI_EMULATE=eager``; Lightning's
popen launcher re-runs this script for rank 1. ``STRATEGY`` is a registered name (``hpu_deepspeed_stage_3``,
``deepspeed_stage_2``...). Modes:

- ``fit``: 4 steps of SGD on 32 samples, batch 4 per rank, then ``validate``, ``test`` and ``predict`` on the same
  samples with the same Trainer (``OUT_DIR/rank<r>.eval.json``: both losses and how many rows this rank predicted);
- ``checkpointed``: 2 epochs of 2 steps (16 samples), a checkpoint directory written at the end of each epoch into
  ``OUT_DIR/ckpt``;
- ``resume``: the same 2 epochs, resumed from the directory ``CKPT`` (``auto:<folder>``: the one the ``"auto"`` resume
  policy picks in that folder).
- ``short``: 2 steps of ``fit``, nothing else (for the exit code at teardown).

Each rank writes ``OUT_DIR/rank<r>.json``: its weights before and after training (gathered in full under ZeRO-3), the
batches it trained on, and how many parameter elements it held during training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from models import Evaluated, evaluate_after_fit, regression_loader, trainer_kwargs

import lightning_gaudi  # noqa: F401  (registers the names)
from lightning_gaudi.resume import resolve_ckpt_path


def _weights(module: torch.nn.Module) -> dict[str, list[Any]]:
    import deepspeed

    params = list(module.parameters())
    zero3 = any(hasattr(p, "ds_id") for p in params)
    with deepspeed.zero.GatheredParameters(params, enabled=zero3):
        return {name: p.detach().float().cpu().clone().tolist() for name, p in module.named_parameters()}


class DeepSpeedProbe(Callback):
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {"batches": [], "held": [], "total": []}

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        engine = trainer.strategy.model
        self.facts.update(
            world_size=trainer.world_size,
            global_rank=trainer.global_rank,
            strategy=type(trainer.strategy).__name__,
            engine=type(engine).__name__,
            zero_stage=engine.zero_optimization_stage(),
            gradient_clipping=engine.gradient_clipping(),
            process_group_backend=torch.distributed.get_backend(),
            initial=_weights(pl_module),
        )

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.facts["batches"].append([tensor.tolist() for tensor in batch])

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Any, optimizer: Any) -> None:
        # ZeRO-3 keeps each parameter's local partition in ds_tensor and leaves the parameter itself empty
        params = list(pl_module.parameters())
        held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
        total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params)
        self.facts["held"].append(held)
        self.facts["total"].append(total)

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts.update(final=_weights(pl_module), steps=trainer.global_step)
        out = Path(sys.argv[1]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps(self.facts))


def main() -> None:
    out, strategy, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    seed_everything(0, verbose=False)
    model = Evaluated()
    probe = DeepSpeedProbe()
    callbacks: list[Callback] = [probe]
    if mode in ("fit", "short"):
        kwargs = trainer_kwargs(max_steps=4 if mode == "fit" else 2)
        loader = regression_loader(samples=32, batch_size=4)
    else:
        kwargs = trainer_kwargs(max_steps=-1, max_epochs=2, enable_checkpointing=True)
        loader = regression_loader(samples=16, batch_size=4)
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_epochs=1, save_top_k=-1))
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=2, callbacks=callbacks, **kwargs)
    ckpt_path = sys.argv[4] if mode == "resume" else None
    if ckpt_path is not None and ckpt_path.startswith("auto:"):  # the resume policy over that folder
        ckpt_path = resolve_ckpt_path("auto", ckpt_path.removeprefix("auto:"))
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    if mode == "fit":
        evaluate_after_fit(trainer, model, loader, out / f"rank{trainer.global_rank}.eval.json")


if __name__ == "__main__":
    main()
