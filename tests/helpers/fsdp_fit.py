"""A real 2-process ``hpu_fsdp`` job under eager emulation, for ``tests/strategies/test_fsdp_emulated.py``.

Run as ``python fsdp_fit.py OUT_DIR STEPS RESUMED_STEPS EPOCHS [STRATEGIES OPTIMIZERS MODELS]`` with
``LIGHTNING_GAUDI_EMULATE=eager``; Lightning's popen launcher re-runs it for rank 1, and the process group the first
Trainer forms serves the later ones. In turn:

- ``fit``: train ``STEPS`` steps, then save the run as a sharded checkpoint ``OUT_DIR/sharded.ckpt`` and as a full one
  ``OUT_DIR/full.ckpt`` (rank 0 writes the sha256 of each of their files to ``OUT_DIR/saved.json``), then validate,
  test and predict (``OUT_DIR/rank<r>.eval.json``); then resume from each of the two checkpoints up to
  ``RESUMED_STEPS`` steps (``OUT_DIR/resume-sharded-rank<r>.json``, ``OUT_DIR/resume-full-rank<r>.json``);
- ``checkpointed``: ``EPOCHS`` epochs, a sharded checkpoint after each in ``OUT_DIR/damaged/straight/ckpt``;
- ``resume-auto``: for each case of :data:`CASES` in turn, the same as ``checkpointed`` in ``OUT_DIR/damaged/CASE``,
  resumed from what the ``"auto"`` resume policy picks in its ``ckpt``, which rank 0 fills with copies of the first
  two checkpoints, the newer one's rank-1 shard with bytes flipped (its checksum index removed in the case without),
  announced in stderr (``job_runs.announce_run(CASE)``);
- given ``STRATEGIES OPTIMIZERS MODELS``: ``optimizer_saves.py``'s cases of them (comma-separated) into
  ``OUT_DIR/optimizer_saves``.

Each training (one Trainer, with a model, strategy and loader of its own, seeded afresh: what a process of its own
would train) writes ``<folder>/<name>-rank<r>.json`` on each rank: its batches, how many parameter and optimizer-state
elements it held during training, and the full weights (gathered) at the start and the end of training.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from damage import fingerprint, flip_bytes
from job_runs import announce_run
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from models import Evaluated, evaluate_after_fit, regression_loader, trainer_kwargs
from torch.distributed.fsdp import FullyShardedDataParallel

from lightning_gaudi import HPUFSDPStrategy
from lightning_gaudi.resume import CHECKSUMS_FILENAME, resolve_ckpt_path

MOMENTUM = 0.9
#: the damaged newest checkpoint's cases, by whether it keeps its checksum index
CASES = {True: "checksums-True", False: "checksums-False"}


class MomentumModel(Evaluated):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=MOMENTUM)


def full_weights(trainer: Trainer, module: torch.nn.Module) -> dict[str, list[Any]]:
    """Every rank's view of the whole model: FSDP gathers the shards (a collective: call it on every rank)."""
    with FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False):
        return {name: tensor.detach().cpu().tolist() for name, tensor in module.state_dict().items()}


class FSDPProbe(Callback):
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {"batches": [], "parameter_elements": [], "optimizer_state_elements": []}

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        model = trainer.strategy.model
        self.facts.update(
            wrapper=type(model).__name__,
            process_group_backend=torch.distributed.get_backend(),
            world_size=trainer.world_size,
            global_rank=trainer.global_rank,
            start_step=trainer.global_step,
            total_parameters=sum(p.numel() for p in pl_module.parameters()),
            start=full_weights(trainer, pl_module),
        )

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.facts["batches"].append([tensor.tolist() for tensor in batch])
        # outside forward and backward each parameter is this rank's shard of it
        self.facts["parameter_elements"].append(sum(p.numel() for p in trainer.strategy.model.parameters()))

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        optimizer = trainer.optimizers[0]
        held = sum(t.numel() for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
        self.facts["optimizer_state_elements"].append(held)

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts.update(final=full_weights(trainer, pl_module), steps=trainer.global_step)


def train(out: Path, mode: str, steps: int, ckpt_path: Path | None = None, facts: str | None = None) -> Trainer:
    """One Trainer's run of ``mode`` (``fit``, ``resume`` from ``ckpt_path``, ``checkpointed`` or ``resume-auto``) in
    ``out``; writes ``out/<facts or mode>-rank<r>.json``. Everything it trains with is new and seeded here."""
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(0, verbose=False)
    model = MomentumModel()
    probe = FSDPProbe()
    strategy = HPUFSDPStrategy(state_dict_type="sharded")
    callbacks: list[Callback] = [probe]
    kwargs = trainer_kwargs(max_steps=steps)
    if mode in ("checkpointed", "resume-auto"):  # STEPS epochs, a sharded checkpoint after each in OUT_DIR/ckpt
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_epochs=1, save_top_k=-1))
        kwargs = trainer_kwargs(max_steps=-1, max_epochs=steps, enable_checkpointing=True)
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=2, callbacks=callbacks, **kwargs)
    loader = regression_loader(samples=32, batch_size=4)
    if mode == "checkpointed":
        trainer.fit(model, train_dataloaders=loader)
    elif mode == "resume-auto":  # each rank asks the resume policy, as a restarted job does
        trainer.fit(model, train_dataloaders=loader, ckpt_path=resolve_ckpt_path("auto", out / "ckpt"))
    elif mode == "fit":
        probe.facts["initial"] = {name: t.tolist() for name, t in model.state_dict().items()}
        trainer.fit(model, train_dataloaders=loader)
        trainer.save_checkpoint(out / "sharded.ckpt")
        strategy.state_dict_type = "full"
        trainer.save_checkpoint(out / "full.ckpt")  # every rank has passed its barrier: both are complete now
        if trainer.is_global_zero:
            saved = {kind: fingerprint(out / f"{kind}.ckpt") for kind in ("sharded", "full")}
            (out / "saved.json").write_text(json.dumps(saved))
        evaluate_after_fit(trainer, model, loader, out / f"rank{trainer.global_rank}.eval.json")
    else:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    (out / f"{facts or mode}-rank{trainer.global_rank}.json").write_text(json.dumps(probe.facts))
    return trainer


def damaged_cases(checkpoints: Path, folder: Path) -> None:
    """``folder/<case>/ckpt`` for each of :data:`CASES`: copies of the first two checkpoints in ``checkpoints``, the
    newer one's rank-1 shard with bytes flipped (its length kept)."""
    first, second = sorted(p.name for p in checkpoints.iterdir())[:2]
    for checksums, case in CASES.items():
        for name in (first, second):
            shutil.copytree(checkpoints / name, folder / case / "ckpt" / name)
        newest = folder / case / "ckpt" / second
        flip_bytes(newest / "__1_0.distcp")
        if not checksums:
            (newest / CHECKSUMS_FILENAME).unlink()


def main() -> None:
    out, steps, resumed_steps, epochs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    train(out, "fit", steps)
    for kind in ("sharded", "full"):
        train(out, "resume", resumed_steps, out / f"{kind}.ckpt", facts=f"resume-{kind}")
    damaged = out / "damaged"
    trainer = train(damaged / "straight", "checkpointed", epochs)
    if trainer.global_rank == 0:
        damaged_cases(damaged / "straight" / "ckpt", damaged)
    trainer.strategy.barrier()
    for case in CASES.values():
        announce_run(case)
        train(damaged / case, "resume-auto", epochs)
    if len(sys.argv) > 5:
        from optimizer_saves import run_cases

        run_cases(out / "optimizer_saves", *(arg.split(",") for arg in sys.argv[5:8]))


if __name__ == "__main__":
    main()
