"""A real 2-process ``hpu_parallel`` fit in compile mode under eager emulation, for
``tests/strategies/test_parallel_compile.py``.

Run as ``python ddp_compile_fit.py OUT_DIR BUCKET_CAP_MB STEPS`` with ``LIGHTNING_GAUDI_EMULATE=eager``,
``LIGHTNING_GAUDI_COMPILE=1`` (compile mode: the strategy adds ``HPUCompile`` by itself) and
``LIGHTNING_GAUDI_COMPILE_BACKEND=aot_eager``. Lightning's popen launcher re-runs this script for rank 1. Each rank
writes ``OUT_DIR/rank<r>.json``: its weights before and after, the compile callback the strategy added, the graphs
it compiled and what ``GraphDiagnostics`` saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from hf_style import HFStyleClassifier, token_loader, token_samples
from lightning.pytorch import Callback, Trainer, seed_everything
from torch.nn.parallel import DistributedDataParallel

from lightning_gaudi import HPUParallelStrategy
from lightning_gaudi.callbacks import GraphDiagnostics, HPUCompile


def _weights(module: torch.nn.Module) -> dict[str, list[Any]]:
    return {name: tensor.detach().cpu().tolist() for name, tensor in module.state_dict().items()}


class Probe(Callback):
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        assert isinstance(trainer.strategy.model, DistributedDataParallel)
        compilers = [c for c in trainer.callbacks if isinstance(c, HPUCompile)]  # type: ignore[attr-defined]
        self.facts.update(
            world_size=trainer.world_size,
            global_rank=trainer.global_rank,
            compile_callbacks=len(compilers),
            compiled_modules=sorted(compilers[0].compiled) if compilers else [],
            initial=_weights(pl_module),
        )

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        diagnostics = next(c for c in trainer.callbacks if isinstance(c, GraphDiagnostics))  # type: ignore[attr-defined]
        self.facts.update(
            steps=trainer.global_step,
            final=_weights(pl_module),
            names=sorted(pl_module.state_dict()),
            summary={k: v for k, v in diagnostics.summary.items() if k != "compilations_by_shape"},
        )


def main() -> None:
    out = Path(sys.argv[1])
    bucket_cap_mb = float(sys.argv[2])
    steps = int(sys.argv[3])
    seed_everything(0, verbose=False)
    model = HFStyleClassifier(lr=0.05)
    probe = Probe()
    trainer = Trainer(
        accelerator="hpu",
        strategy=HPUParallelStrategy(bucket_cap_mb=bucket_cap_mb),
        devices=2,
        callbacks=[GraphDiagnostics(warmup_steps=1), probe],
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, token_loader(token_samples(32, 8, 8), batch_size=4))
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(probe.facts))


if __name__ == "__main__":
    main()
