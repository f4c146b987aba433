"""Real multi-process ``hpu_model_parallel`` fits under eager emulation (tests/strategies/test_model_parallel.py).

Run as ``python model_parallel_fit.py OUT_DIR fit DP TP PLAN STEPS [RESUMED_STEPS]`` or ``python model_parallel_fit.py
OUT_DIR layouts STEPS RESUMED_STEPS LAYOUT...`` with ``LIGHTNING_GAUDI_EMULATE=eager``, under torchrun or alone
(Lightning's popen launcher re-runs it for the other ranks). ``PLAN`` is ``tp`` (tensor parallelism), ``fsdp`` (FSDP2)
or ``both`` (tensor parallelism, then FSDP2 over the data-parallel dimension).

``fit`` trains ``STEPS`` steps with gradient clipping, then saves a sharded checkpoint ``OUT_DIR/sharded.ckpt`` and a
full one ``OUT_DIR/full.ckpt``. Given ``RESUMED_STEPS``, it then resumes, in the same processes, from each of them up to
that many steps: the sharded one through the resume policy over ``OUT_DIR/ckpt``, which holds it and a newer copy
with a damaged shard. Each rank writes ``OUT_DIR/<run>-rank<r>.json`` (``fit``, ``resume-sharded``, ``resume-full``):
its data-parallel rank, its batches and losses, the bytes of parameters and optimizer state it held, the reduce ops
of the reduce-scatters it ran (FSDP2's gradients) and the full weights at the start and the end of training.

``layouts`` does the same for each ``LAYOUT`` (``PLAN,DP,TP,RESUME``: ``RESUME`` 1 resumes to ``RESUMED_STEPS``, 0
does not) in turn, in the same processes and process group, into ``OUT_DIR/<PLAN>-dp<DP>-tp<TP>``; then, given
``--fabric KIND[,KIND...] STEPS TOTAL`` after the layouts, ``fabric_sharded.py``'s Fabric loops of those kinds into
``OUT_DIR/fabric/<KIND>``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from damage import flip_bytes
from lightning.pytorch import Callback, Trainer, seed_everything
from models import RegressionModel, regression_loader, trainer_kwargs
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from lightning_gaudi import HPUModelParallelStrategy
from lightning_gaudi.emulator.hccl_group import EmulatedHCCLGroup
from lightning_gaudi.resume import resolve_ckpt_path

MOMENTUM = 0.9
CLIP = 0.5


def local_bytes(tensors: Any) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def full_weights(module: torch.nn.Module) -> dict[str, list[Any]]:
    """Every rank's view of the whole model (gathering a DTensor is a collective: call it on every rank)."""
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().tolist()
        for name, t in module.state_dict().items()
    }


class ParallelModel(RegressionModel):
    def __init__(self, plan: str) -> None:
        super().__init__()
        self.plan = plan

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if self.plan in ("tp", "both"):
            parallelize_module(self.net, mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        if self.plan in ("fsdp", "both"):
            for layer in (self.net[0], self.net[2]):
                fully_shard(layer, mesh=mesh["data_parallel"])
            fully_shard(self.net, mesh=mesh["data_parallel"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=MOMENTUM)


class Probe(Callback):
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {"batches": [], "losses": [], "reduce_scatter_ops": []}
        self._reduce_scatter = EmulatedHCCLGroup._reduce_scatter_single

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        # the process group's reduce-scatter (FSDP2's gradients), whichever torch function reached it
        ops, reduce_scatter = self.facts["reduce_scatter_ops"], self._reduce_scatter

        def record(group: EmulatedHCCLGroup, output: Any, input: Any, opts: Any) -> Any:
            if opts.reduceOp.op.name not in ops:
                ops.append(opts.reduceOp.op.name)
            return reduce_scatter(group, output, input, opts)

        EmulatedHCCLGroup._reduce_scatter_single = record  # type: ignore[method-assign]

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        EmulatedHCCLGroup._reduce_scatter_single = self._reduce_scatter  # type: ignore[method-assign]

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        mesh = trainer.strategy.device_mesh
        self.facts.update(
            mesh_device=mesh.device_type,
            data_parallel_rank=mesh["data_parallel"].get_local_rank(),
            start_step=trainer.global_step,
            start=full_weights(pl_module),
            parameter_bytes=local_bytes(pl_module.parameters()),
        )

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.facts["batches"].append([tensor.tolist() for tensor in batch])

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.facts["losses"].append(outputs["loss"].item())  # this rank's loss on its own batch

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        states = trainer.optimizers[0].state.values()
        self.facts.update(
            final=full_weights(pl_module),
            steps=trainer.global_step,
            optimizer_bytes=local_bytes(t for state in states for t in state.values() if torch.is_tensor(t)),
        )


def run(out: Path, mode: str, dp: int, tp: int, plan: str, steps: int, ckpt_path: str | None = None) -> Trainer:
    """One fit (a fresh seed, model, strategy and Trainer), its facts in ``OUT_DIR/<mode>-rank<r>.json``."""
    seed_everything(0, verbose=False)
    model = ParallelModel(plan)
    probe = Probe()
    strategy = HPUModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    trainer = Trainer(
        accelerator="hpu",
        strategy=strategy,
        devices=dp * tp,
        callbacks=[probe],
        gradient_clip_val=CLIP,
        **trainer_kwargs(max_steps=steps),
    )
    loader = regression_loader(samples=32, batch_size=4)
    if ckpt_path is None:
        probe.facts["initial"] = {name: t.tolist() for name, t in model.state_dict().items()}
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    if ckpt_path is None:
        trainer.save_checkpoint(out / "sharded.ckpt")
        strategy._save_distributed_checkpoint = False
        trainer.save_checkpoint(out / "full.ckpt")
    (out / f"{mode}-rank{trainer.global_rank}.json").write_text(json.dumps(probe.facts))
    return trainer


def damaged_newer_copy(checkpoint: Path, folder: Path) -> None:
    """``folder`` with ``checkpoint`` intact and a copy one step newer whose rank-1 shard has bytes flipped."""
    shutil.copytree(checkpoint, folder / "intact.ckpt")
    newer = Path(shutil.copytree(checkpoint, folder / "newer.ckpt"))
    meta = torch.load(newer / "meta.pt", weights_only=False)
    torch.save({**meta, "global_step": meta["global_step"] + 1}, newer / "meta.pt")
    flip_bytes(newer / "__1_0.distcp")


def fit_and_resume(out: Path, dp: int, tp: int, plan: str, steps: int, resumed_steps: int | None) -> None:
    """The fit into ``out``, then (given ``resumed_steps``) its two resumes."""
    trainer = run(out, "fit", dp, tp, plan, steps)
    if resumed_steps is not None:
        if trainer.global_rank == 0:
            damaged_newer_copy(out / "sharded.ckpt", out / "ckpt")
        trainer.strategy.barrier()
        sharded = resolve_ckpt_path("auto", out / "ckpt")  # every rank's policy skips the damaged copy
        for kind, ckpt_path in (("sharded", str(sharded)), ("full", str(out / "full.ckpt"))):
            run(out, f"resume-{kind}", dp, tp, plan, resumed_steps, ckpt_path)


def main() -> None:
    out, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if mode == "layouts":
        steps, resumed_steps = int(args[0]), int(args[1])
        fabric = args[args.index("--fabric") :] if "--fabric" in args else []
        for layout in args[2 : len(args) - len(fabric)]:
            plan, dp, tp, resume = layout.split(",")
            folder = out / f"{plan}-dp{dp}-tp{tp}"
            folder.mkdir(parents=True, exist_ok=True)
            fit_and_resume(folder, int(dp), int(tp), plan, steps, resumed_steps if resume == "1" else None)
        if fabric:
            from fabric_sharded import run as fabric_loop

            for kind in fabric[1].split(","):
                fabric_loop(out / "fabric" / kind, kind, int(fabric[2]), int(fabric[3]))
    else:
        resumed_steps = int(args[4]) if len(args) > 4 else None
        fit_and_resume(out, int(args[0]), int(args[1]), args[2], int(args[3]), resumed_steps)


if __name__ == "__main__":
    main()
