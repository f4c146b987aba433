"""Strategy objects as code written for GPUs builds them, on 2 emulated HPUs (tests/routing/test_objects_emulated.py).

Run as ``python gpu_objects_fit.py OUT_DIR`` with ``LIGHTNING_GAUDI_EMULATE=eager``. First ``gpu_objects_fabric.py``'s
Fabric runs into ``OUT_DIR/fabric`` (the first ``fabric.launch()`` re-runs this script for rank 1), then, reusing the
processes and the process group, the Trainer runs. For each kind (a third party's ``DDPStrategy``
subclass, ``FSDPStrategy``, ``DeepSpeedStrategy`` stage 3, ``ModelParallelStrategy``):

- ``name-first``, ``name``: the HPU strategy by name (or class), 2 steps (one epoch) and a checkpoint, then a new
  Trainer resuming from it to 4 steps, then validate, test and predict;
- ``object-first``, ``object``: the same with Lightning's object;
- ``empty``: 2 steps with the object and the model built under ``trainer.init_module(empty_init=True)`` (the sharded
  kinds).

Each rank writes ``OUT_DIR/rank<r>.json``: per kind and run, the losses, the full weights at the end, the evaluation
and the strategy's class.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning_utilities.core.imports import RequirementCache
from models import Evaluated, regression_loader, trainer_kwargs
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel, fully_shard
from torch.distributed.tensor import DTensor

import lightning_gaudi

MOMENTUM = 0.9


class LibraryDDP(DDPStrategy):
    """A library's own subclass, as Ray's ``RayDDPStrategy``."""


class MomentumModel(Evaluated):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)  # through the root module (FSDP2's root must run first)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=MOMENTUM)


class ConstantLinear(torch.nn.Linear):
    """Initialized without randomness: a meta-device model is materialized shard by shard, and on the CPU no DTensor
    random-number tracker makes that match a full initialization (on a Gaudi it does)."""

    def reset_parameters(self) -> None:
        torch.nn.init.constant_(self.weight, 0.3 / self.in_features)
        torch.nn.init.constant_(self.bias, -0.05)


class ShardedModel(MomentumModel):
    """FSDP2 over both ranks in ``configure_model``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(ConstantLinear(4, 8), torch.nn.Tanh(), ConstantLinear(8, 1))

    def configure_model(self) -> None:
        if isinstance(self.net, FSDPModule):  # called again by validate, test and predict: idempotent
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def full_weights(trainer: Trainer, module: torch.nn.Module) -> dict[str, list[Any]]:
    model = trainer.strategy.model
    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            return {k: v.detach().cpu().tolist() for k, v in module.state_dict().items()}
    if hasattr(model, "zero_optimization_partition_weights") and model.zero_optimization_partition_weights():
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            return {k: v.detach().cpu().tolist() for k, v in module.state_dict().items()}
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().tolist()
        for k, v in module.state_dict().items()
    }


def run(strategy: Any, steps: int, ckpt: Path | None = None, save: Path | None = None, empty: bool = False,
        sharded: bool = False) -> dict[str, Any]:  # fmt: skip
    seed_everything(0, verbose=False)
    losses = Losses()
    trainer = Trainer(accelerator="hpu", devices=2, strategy=strategy, callbacks=[losses],
                      **trainer_kwargs(max_steps=steps))  # fmt: skip
    if empty:
        with trainer.init_module(empty_init=True):
            model = ShardedModel() if sharded else MomentumModel()
    else:
        model = ShardedModel() if sharded else MomentumModel()
    loader = regression_loader(samples=16, batch_size=4)  # an epoch of 2 steps per rank: the checkpoint ends one
    trainer.fit(model, train_dataloaders=loader, ckpt_path=str(ckpt) if ckpt else None)
    result: dict[str, Any] = {"losses": losses.losses, "classes": [c.__name__ for c in type(trainer.strategy).__mro__]}
    result["final"] = full_weights(trainer, model)
    result["is_object_class"] = isinstance(trainer.strategy, type(strategy)) if not isinstance(strategy, str) else None
    if save is not None:
        trainer.save_checkpoint(save)
        return result
    result["eval"] = {
        "validate": trainer.validate(model, loader, verbose=False)[0]["val_loss"],
        "test": trainer.test(model, loader, verbose=False)[0]["test_loss"],
        "predicted": torch.cat(trainer.predict(model, loader)).flatten().tolist(),
    }
    return result


def main() -> None:
    from gpu_objects_fabric import run_all

    out = Path(sys.argv[1])
    run_all(out / "fabric")
    kinds: dict[str, tuple[Any, Any, bool]] = {
        "ddp": (lambda: "hpu_parallel", lambda: LibraryDDP(), False),
        "fsdp": (
            lambda: lightning_gaudi.HPUFSDPStrategy(auto_wrap_policy={torch.nn.Linear}),
            lambda: FSDPStrategy(auto_wrap_policy={torch.nn.Linear}, state_dict_type="full", cpu_offload=False),
            False,
        ),
        "deepspeed": (lambda: "hpu_deepspeed_stage_3", lambda: DeepSpeedStrategy(stage=3), False),
        "model_parallel": (
            lambda: lightning_gaudi.HPUModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
            lambda: ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
            True,
        ),
    }
    if not RequirementCache("deepspeed"):  # the test skips its DeepSpeed cases, saying so
        del kinds["deepspeed"]
    facts: dict[str, Any] = {}
    for kind, (by_name, as_object, sharded) in kinds.items():
        facts[kind] = {}
        for how, build in (("name", by_name), ("object", as_object)):
            ckpt = out / f"{kind}-{how}.ckpt"
            facts[kind][f"{how}-first"] = run(build(), 2, save=ckpt, sharded=sharded)
            facts[kind][how] = run(build(), 4, ckpt=ckpt, sharded=sharded)
        if kind != "ddp":
            facts[kind]["empty"] = run(as_object(), 2, save=out / f"{kind}-empty.ckpt", empty=True, sharded=sharded)
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(facts))
    torch.distributed.barrier()  # every rank has written before rank 0, whose exit the test waits for, leaves


if __name__ == "__main__":
    main()
