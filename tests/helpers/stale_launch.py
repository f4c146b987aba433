"""A 1-device Fabric launch, then a 2-device Trainer in the same process (``tests/distributed/test_stale_launch.py``).

``python stale_launch.py OUT`` with ``LIGHTNING_GAUDI_EMULATE=eager``: first tries the Trainer while the Fabric
launch's process group lives and writes the error it raised to ``OUT/refused.txt`` (exit 1 if none), then ends the
group and trains (both cases in one process). Lightning's launcher re-runs this script for the Trainer's rank 1,
which skips the Fabric part (its ``LOCAL_RANK`` is set). Each rank writes ``OUT/rank<r>.json``: the Trainer's world
size and its process group's.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.fabric import Fabric

sys.path.insert(0, str(Path(__file__).parent))
from workload import Workload, loader, quiet_trainer

import lightning_gaudi  # noqa: F401  # registers the strategies

out = Path(sys.argv[1])
if "LOCAL_RANK" not in os.environ:
    fabric = Fabric(accelerator="hpu", devices=1, strategy="hpu_parallel")
    fabric.launch()
    fabric.setup(torch.nn.Linear(2, 1))
    try:
        quiet_trainer(devices=2, strategy="hpu_parallel", max_steps=2).fit(Workload(), loader(4))
    except Exception:
        ranks = sorted(p.name for p in out.glob("rank*.json"))
        (out / "refused.txt").write_text(f"{traceback.format_exc()}\nrank files: {ranks}\n")
    else:
        sys.exit("the Trainer was not refused while the Fabric launch's group lived")
    dist.destroy_process_group()
trainer = quiet_trainer(devices=2, strategy="hpu_parallel", max_steps=2)
trainer.fit(Workload(), loader(4))
result = {"world_size": trainer.world_size, "group": dist.get_world_size()}
(out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
