"""A training script written for GPUs, as users bring them: no ``import lightning_gaudi``, Lightning's automatic
choices. ``python gpu_script.py DEVICES EXIT_CODE OUT``: fits 2 steps, writes each rank's accelerator and strategy to
``OUT/rank<r>.json`` and exits with ``EXIT_CODE``."""

import json
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel

if __name__ == "__main__":
    devices, code, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    trainer = L.Trainer(
        devices=devices,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    facts = {"accelerator": type(trainer.accelerator).__name__, "strategy": type(trainer.strategy).__name__}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({**facts, "argv": sys.argv[1:]}))
    sys.exit(code)
