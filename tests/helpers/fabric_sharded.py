"""A real 2-process Fabric loop on a sharded HPU strategy under eager emulation, for
``tests/fabric/test_model_parallel.py``.

:func:`run` runs at the end of ``model_parallel_fit.py``'s layouts job (torchrun's 2 processes and process group), once
per kind into ``OUT_DIR/<kind>`` (``OUT_DIR`` below), with a Fabric object of its own. The kind is ``tp``
(``HPUModelParallelStrategy``, tensor parallelism on 2 cards), ``fsdp2`` (the same, FSDP2 over 2 data-parallel ranks)
or ``fsdp`` (``"hpu_fsdp"``). Each rank trains
``STEPS`` steps with gradient clipping, saves a sharded checkpoint with ``fabric.save``, trains on to ``TOTAL``, then
loads the checkpoint into a fresh model and optimizer with ``fabric.load`` and trains the same steps again. Then it
damages rank 1's shard of a checkpoint saved at ``TOTAL`` in ``OUT_DIR/ckpt`` and resumes with the ``"auto"`` policy
there, with the checkpoint's checksum index and without. It writes ``OUT_DIR/rank<r>.json``: the initial weights, the
global rows each step trained on, and the full weights of every run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from damage import flip_bytes
from lightning.fabric import Fabric, seed_everything
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from lightning_gaudi.fabric import HPUModelParallelStrategy
from lightning_gaudi.resume import CHECKSUMS_FILENAME, resolve_ckpt_path

BATCH, MOMENTUM, CLIP = 8, 0.9, 0.5


def tensor_parallel(module: nn.Module, mesh: Any) -> nn.Module:
    return parallelize_module(module, mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})


def fsdp2(module: nn.Module, mesh: Any) -> nn.Module:
    fully_shard(module[0], mesh=mesh["data_parallel"])
    return fully_shard(module, mesh=mesh["data_parallel"])


def full_weights(model: Any) -> dict[str, list[Any]]:
    module = model._forward_module
    if isinstance(module, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(module, writeback=False):
            return {k: v.tolist() for k, v in module.module.state_dict().items()}
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).tolist() for k, v in module.state_dict().items()}


def run(out: Path, kind: str, steps: int, total: int) -> None:
    """One strategy's loop, its facts in ``out/rank<r>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    if kind == "fsdp":
        strategy: Any = "hpu_fsdp"
    else:
        strategy = HPUModelParallelStrategy(
            tensor_parallel if kind == "tp" else fsdp2, *((1, 2) if kind == "tp" else (2, 1))
        )
    fabric = Fabric(accelerator="hpu", strategy=strategy, devices=2)
    fabric.launch()
    data_parallel = kind != "tp"
    x = torch.randn(total * BATCH, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)

    def build() -> tuple[Any, Any]:
        seed_everything(0, verbose=False)
        model = fabric.setup_module(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
        return model, fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM))

    def train(model: Any, optimizer: Any, first: int, last: int) -> list[list[int]]:
        rows = []
        for step in range(first, last):
            start = step * BATCH + (fabric.global_rank * BATCH // 2 if data_parallel else 0)
            part = range(start, start + (BATCH // 2 if data_parallel else BATCH))
            rows.append(list(part))
            loss = nn.functional.mse_loss(model(x[part.start : part.stop]), y[part.start : part.stop])
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=CLIP)
            optimizer.step()
            optimizer.zero_grad()
        return rows

    model, optimizer = build()
    facts: dict[str, Any] = {"initial": full_weights(model), "strategy": type(fabric.strategy).__name__}
    facts["rows"] = train(model, optimizer, 0, steps)
    fabric.save(out / "sharded.ckpt", {"model": model, "optimizer": optimizer, "step": steps})
    ckpt = out / "ckpt"  # for the resume policy: the same state, then the state at TOTAL (damaged below)
    fabric.save(ckpt / "older.ckpt", {"model": model, "optimizer": optimizer, "global_step": steps})
    facts["rows"] += train(model, optimizer, steps, total)
    facts["uninterrupted"] = full_weights(model)
    fabric.save(ckpt / "newest.ckpt", {"model": model, "optimizer": optimizer, "global_step": total})

    model, optimizer = build()
    state = {"model": model, "optimizer": optimizer, "step": 0}
    fabric.load(out / "sharded.ckpt", state)
    facts["loaded_step"] = state["step"]
    train(model, optimizer, state["step"], total)
    facts["resumed"] = full_weights(model)
    facts["checkpoint_files"] = sorted(p.name for p in (out / "sharded.ckpt").iterdir())

    # Rank 1's shard of the newest checkpoint damaged, its length kept. With its checksum index the resume policy skips
    # it; without (an older checkpoint) it verifies, fails to load, and fabric.load moves it aside and loads the older
    if fabric.global_rank == 0:
        flip_bytes(ckpt / "newest.ckpt" / "__1_0.distcp")
    for checksums in (True, False):
        if not checksums and fabric.global_rank == 0:
            (ckpt / "newest.ckpt" / CHECKSUMS_FILENAME).unlink()
        fabric.barrier()
        chosen = resolve_ckpt_path("auto", ckpt)  # on every rank, as a restarted job does
        model, optimizer = build()
        state = {"model": model, "optimizer": optimizer, "global_step": 0}
        fabric.load(chosen, state)
        train(model, optimizer, state["global_step"], total)
        facts[f"damaged-checksums-{checksums}"] = {
            "chosen": Path(str(chosen)).name,
            "loaded_step": state["global_step"],
            "resumed": full_weights(model),
        }
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(facts))
