"""A real 2-process ``hpu_parallel`` fit under eager emulation, for ``tests/strategies/test_parallel_emulated.py``.

:func:`run` is one of the fits ``parallel_scenarios.py`` runs in its rank processes. Each rank writes
``OUT/rank<r>.json``: what its ``DistributedDataParallel`` object holds, whether every gradient was a view into a
bucket the reducer all-reduced, and its weights before and after training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from models import RegressionModel, regression_loader, trainer_kwargs
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from lightning_gaudi import HPUParallelStrategy


def _weights(module: torch.nn.Module) -> dict[str, list[Any]]:
    return {name: tensor.detach().cpu().tolist() for name, tensor in module.state_dict().items()}


class DDPProbe(Callback):
    """Reads the DDP wrapper and checks, after every backward, that each gradient lives in a reducer bucket."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.facts: dict[str, Any] = {}
        self.buckets: list[torch.Tensor] = []
        self.views_per_step: list[bool] = []
        self.batches: list[list[Any]] = []
        self.hook_calls = 0
        self.grads_released: list[bool] = []

    def _hook(self, state, bucket):  # type: ignore[no-untyped-def]  # unannotated: DDP checks string annotations
        # keep the bucket's flat buffer: the gradients must be views into exactly these tensors
        self.hook_calls += 1
        self.buckets.append(bucket.buffer())
        return allreduce_hook(state, bucket)

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        ddp = trainer.strategy.model
        assert isinstance(ddp, DistributedDataParallel), type(ddp)
        self.facts.update(
            world_size=trainer.world_size,
            global_rank=trainer.global_rank,
            process_group_backend=torch.distributed.get_backend(),
            bucket_bytes_cap=ddp.bucket_bytes_cap,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            static_graph=ddp.static_graph,
            find_unused_parameters=ddp.find_unused_parameters,
            strategy=type(trainer.strategy).__name__,
            initial=_weights(pl_module),
        )

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.buckets.clear()
        self.grads_released.append(all(p.grad is None for p in pl_module.parameters()))
        self.batches.append([tensor.tolist() for tensor in batch])

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Any, optimizer: Any) -> None:
        storages = {bucket.untyped_storage().data_ptr() for bucket in self.buckets}
        grads = [p.grad for p in pl_module.parameters()]
        self.views_per_step.append(
            bool(self.buckets) and all(g is not None and g.untyped_storage().data_ptr() in storages for g in grads)
        )

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.facts.update(
            batches=self.batches,
            views_per_step=self.views_per_step,
            hook_calls=self.hook_calls,
            grads_released=self.grads_released,
            final=_weights(pl_module),
            steps=trainer.global_step,
        )
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.facts))


def run(out: Path, bucket_cap_mb: float, gradient_as_bucket_view: bool, static_graph: bool, steps: int) -> None:
    """One fit (a fresh seed, model, strategy, Trainer and loader), its facts in ``out/rank<r>.json``."""
    seed_everything(0, verbose=False)
    model = RegressionModel()
    probe = DDPProbe(out)
    strategy = HPUParallelStrategy(
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
        ddp_comm_hook=probe._hook,  # the strategy must register it (Lightning's DDPStrategy does so on CUDA only)
    )
    trainer = Trainer(
        accelerator="hpu", strategy=strategy, devices=2, callbacks=[probe], **trainer_kwargs(max_steps=steps)
    )
    trainer.fit(model, train_dataloaders=regression_loader(samples=32, batch_size=4))
