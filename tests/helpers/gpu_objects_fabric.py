"""Fabric's strategy objects as code written for GPUs builds them (LitGPT builds ``FSDPStrategy(...)`` and
``ModelParallelStrategy(...)``), on 2 emulated HPUs (tests/routing/test_objects_emulated.py).

:func:`run_all` runs first in ``gpu_objects_fit.py``'s job (its first ``fabric.launch()`` re-runs that script for rank
1; the later Fabric and Trainer objects reuse the processes and the process group). For each kind (a library's
``DDPStrategy`` subclass, ``FSDPStrategy``, ``ModelParallelStrategy``) and each way of asking for it (``name``: the HPU
strategy's name or class; ``object``: Lightning's object): 2 steps and ``fabric.save``, then a new Fabric that loads it
and trains 2 more, then evaluates. ``empty``: 2 steps with the object and the model built under
``fabric.init_module(empty_init=True)`` (the sharded kinds). Each rank writes ``<its folder>/rank<r>.json`` with the
losses, evaluation and strategy classes of every run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from gpu_objects_fit import ConstantLinear
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
from models import make_net, regression_loader
from torch.distributed.fsdp import fully_shard

import lightning_gaudi.fabric as hpu_fabric

MOMENTUM = 0.9


class LibraryDDP(DDPStrategy):
    """A library's own subclass of Fabric's DDP strategy."""


def parallelize(module: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    for layer in (module[0], module[2]):
        fully_shard(layer, mesh=mesh["data_parallel"])
    fully_shard(module, mesh=mesh["data_parallel"])
    return module


def constant_net() -> torch.nn.Module:
    return torch.nn.Sequential(ConstantLinear(4, 8), torch.nn.Tanh(), ConstantLinear(8, 1))


def run(strategy: Any, net: Any, ckpt: Path, resume: bool, empty: bool = False) -> dict[str, Any]:
    fabric = Fabric(accelerator="hpu", devices=2, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0, verbose=False)
    if empty:
        with fabric.init_module(empty_init=True):
            model = net()
    else:
        model = net()
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM))
    state = {"model": model, "optimizer": optimizer}
    if resume:
        fabric.load(ckpt, state)
    loader = fabric.setup_dataloaders(regression_loader(samples=16, batch_size=4))
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    result: dict[str, Any] = {"losses": losses, "classes": [c.__name__ for c in type(fabric.strategy).__mro__]}
    if not resume:
        fabric.save(ckpt, state)
        return result
    with torch.no_grad():
        result["eval"] = [model(x).flatten().tolist() for x, _ in loader]
    return result


def run_all(out: Path) -> None:
    """Every kind's runs, each rank's facts in ``out/rank<r>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    kinds: dict[str, tuple[Any, Any, Any]] = {
        "ddp": (lambda: "hpu_parallel", lambda: LibraryDDP(), make_net),
        "fsdp": (lambda: "hpu_fsdp", lambda: FSDPStrategy(), make_net),
        "model_parallel": (
            lambda: hpu_fabric.HPUModelParallelStrategy(parallelize, data_parallel_size=2, tensor_parallel_size=1),
            lambda: ModelParallelStrategy(parallelize, data_parallel_size=2, tensor_parallel_size=1),
            constant_net,
        ),
    }
    facts: dict[str, Any] = {}
    for kind, (by_name, as_object, net) in kinds.items():
        facts[kind] = {}
        for how, build in (("name", by_name), ("object", as_object)):
            ckpt = out / f"{kind}-{how}.ckpt"
            facts[kind][f"{how}-first"] = run(build(), net, ckpt, resume=False)
            facts[kind][how] = run(build(), net, ckpt, resume=True)
        if kind != "ddp":
            facts[kind]["empty"] = run(as_object(), net, out / f"{kind}-empty.ckpt", resume=False, empty=True)
    (out / f"rank{torch.distributed.get_rank()}.json").write_text(json.dumps(facts))
    torch.distributed.barrier()  # every rank has written before the job goes on
