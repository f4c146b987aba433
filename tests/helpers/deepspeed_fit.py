"""Real 2-process ``hpu_deepspeed`` fits under eager emulation, for ``tests/strategies/test_deepspeed_emulated.py``.

Run as ``python deepspeed_fit.py OUT_DIR STRATEGY[,STRATEGY...] MODE[,MODE...]`` with
``LIGHTNING_GAUDI_EMULATE=eager``, under torchrun or alone (Lightning's popen launcher re-runs this script for rank 1);
the process group the first Trainer forms serves the later ones. ``STRATEGY`` is a registered name
(``hpu_deepspeed_stage_3``, ``deepspeed_stage_2``...). The modes run in the order given:

- ``fit``: for each strategy in the order given, 4 steps of SGD on 32 samples, batch 4 per rank, then ``validate``,
  ``test`` and ``predict`` on the same samples with the same Trainer (``OUT_DIR/<STRATEGY>/rank<r>.eval.json``: both
  losses and how many rows this rank predicted). A ZeRO-3 engine replaces ``torch.nn.functional.linear`` for the life
  of the process: name ZeRO-3 strategies last;
- ``checkpointed``: with the last strategy, 2 epochs of 2 steps (16 samples), a checkpoint directory written at the
  end of each epoch into ``OUT_DIR/straight/ckpt``; then, in the same processes, the same 2 epochs resumed into
  ``OUT_DIR/resumed`` from the first directory, and into ``OUT_DIR/auto`` from the one the ``"auto"`` resume policy
  picks in ``OUT_DIR/auto/ckpt``, which rank 0 fills with copies of both directories, the newest made unloadable;
- ``short``: with the last strategy, 2 steps of ``fit`` into ``OUT_DIR`` (for the exit code at teardown).

Every run is a fresh seed, model, strategy and Trainer; rank 0 starts it with ``job_runs.announce_run(<its folder's
name>)``. Each rank writes ``<its folder>/rank<r>.json``: its weights before and
after training (gathered in full under ZeRO-3), the batches it trained on, how many parameter elements it held during
training, and the checkpoint it resumed from.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from damage import make_unloadable
from job_runs import announce_run
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
    def __init__(self, out: Path) -> None:
        self.out = out
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
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.facts))


def run(out: Path, strategy: str, mode: str, ckpt_path: str | None = None) -> Trainer:
    """One fit of ``mode`` (a fresh seed, model, strategy and Trainer) into ``out``, resumed from ``ckpt_path``,
    announced in stderr under ``out``'s name."""
    out.mkdir(parents=True, exist_ok=True)
    announce_run(out.name)
    seed_everything(0, verbose=False)
    model = Evaluated()
    probe = DeepSpeedProbe(out)
    probe.facts["ckpt_path"] = ckpt_path
    callbacks: list[Callback] = [probe]
    if mode in ("fit", "short"):
        kwargs = trainer_kwargs(max_steps=4 if mode == "fit" else 2)
        loader = regression_loader(samples=32, batch_size=4)
    else:
        kwargs = trainer_kwargs(max_steps=-1, max_epochs=2, enable_checkpointing=True)
        loader = regression_loader(samples=16, batch_size=4)
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_epochs=1, save_top_k=-1))
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=2, callbacks=callbacks, **kwargs)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    if mode == "fit":
        evaluate_after_fit(trainer, model, loader, out / f"rank{trainer.global_rank}.eval.json")
    return trainer


def unloadable_newest(checkpoints: Path, folder: Path) -> None:
    """``folder`` with copies of the two checkpoint directories in ``checkpoints``, the newest one's model states
    rewritten to verify but not load."""
    shutil.copytree(checkpoints / "epoch=0-step=2.ckpt", folder / "epoch=0-step=2.ckpt")
    broken = Path(shutil.copytree(checkpoints / "epoch=1-step=4.ckpt", folder / "epoch=1-step=4.ckpt"))
    for states in (broken / "checkpoint").glob("*model_states.pt"):
        make_unloadable(states)


def checkpointed(out: Path, strategy: str) -> None:
    """The ``checkpointed`` mode's three runs into ``out``."""
    trainer = run(out / "straight", strategy, "checkpointed")
    run(out / "resumed", strategy, "checkpointed", str(out / "straight" / "ckpt" / "epoch=0-step=2.ckpt"))
    if trainer.global_rank == 0:
        unloadable_newest(out / "straight" / "ckpt", out / "auto" / "ckpt")
    trainer.strategy.barrier()
    ckpt_path = resolve_ckpt_path("auto", out / "auto" / "ckpt")  # on every rank
    run(out / "auto", strategy, "checkpointed", ckpt_path)


def main() -> None:
    out, strategies, modes = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
    for mode in modes:
        if mode == "short":
            run(out, strategies[-1], mode)
        elif mode == "fit":
            for strategy in strategies:
                run(out / strategy, strategy, mode)
        else:
            checkpointed(out, strategies[-1])


if __name__ == "__main__":
    main()
