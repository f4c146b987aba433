"""A 2-process DDP fit with ``accelerator="hpu"`` on the bridge double, for ``tests/hpu/test_bridge_rendezvous.py``.

Run as ``python bridge_double_fit.py OUT_DIR`` with ``tests/bridge_double`` on ``PYTHONPATH`` and
``LIGHTNING_GAUDI_EMULATE`` unset: the plugin drives the double through its real-bridge seam (``HabanaBackend``), whose
import sets what Intel's bridge sets (``MASTER_ADDR=localhost``, ``MASTER_PORT=12345`` where unset), and Lightning's
launcher starts rank 1. The double's cards hold no tensors (a CPU build of torch has no ``hpu`` device), so this job
keeps the backend's tensors on the CPU; the ``"hccl"`` process group is the double's (gloo behind HCCL's rules). Each
rank writes ``OUT_DIR/rank<r>.json``: the rendezvous port, the process-group backend, the final weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Callback, Trainer, seed_everything
from models import RegressionModel, regression_loader, trainer_kwargs

import lightning_gaudi  # noqa: F401  (registers the names)
from lightning_gaudi.hpu.bridge import HabanaBackend

HabanaBackend.device_type = "cpu"  # the double's cards hold no tensors


class Facts(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        facts = {
            "master_port": os.environ.get("MASTER_PORT"),
            "backend": dist.get_backend(),
            "world_size": trainer.world_size,
            "final": {name: tensor.tolist() for name, tensor in pl_module.state_dict().items()},
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))


def main() -> None:
    out = Path(sys.argv[1])
    seed_everything(0, verbose=False)
    trainer = Trainer(
        accelerator="hpu", strategy="ddp", devices=2, callbacks=[Facts(out)], **trainer_kwargs(max_steps=2)
    )
    trainer.fit(RegressionModel(), train_dataloaders=regression_loader(samples=16, batch_size=4))


if __name__ == "__main__":
    main()
