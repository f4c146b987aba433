"""Train the example GPT with Lightning Fabric on Gaudi, or on the emulated HPU when there is no Gaudi.

    python examples/fabric_train.py                          # 1 HPU, 100 steps (eager emulation without a Gaudi)
    python examples/fabric_train.py --devices 2              # DDP, one process per card (HCCL; gloo in emulation)
    python examples/fabric_train.py --precision bf16-mixed   # the default on a Gaudi; 32-true in emulation
    LIGHTNING_GAUDI_EMULATE=lazy python examples/fabric_train.py --steps 20   # lazy mode, emulated

The loop is plain PyTorch with Fabric's calls (``setup``, ``setup_dataloaders``, ``backward``, ``clip_gradients``,
``all_reduce``, ``save``): the same loop runs on CUDA with ``accelerator="cuda"``. In lazy mode the strategy cuts the
graph after ``fabric.backward`` and after the optimizer step; the evaluation loop cuts after each batch itself. The
model and the data are the recipe's (``examples/gpt_recipe``); the checkpoint holds CPU tensors.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from gpt_recipe.data import VOCAB_SIZE, StdlibTextDataModule
from gpt_recipe.model import GPT
from lightning.fabric import Fabric

import lightning_gaudi
from lightning_gaudi import hpu


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1, help="HPUs on this node (more than 1: hpu_parallel)")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--precision", default=None, help="default: bf16-mixed on a Gaudi, 32-true in emulation")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32, help="per card")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--val-batches", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=20, help="steps between loss prints (each is a host sync)")
    parser.add_argument("--max-bytes", type=int, default=4_000_000, help="training text to read")
    parser.add_argument("--out", type=Path, default=Path("logs/fabric"), help="where the checkpoint goes")
    return parser.parse_args(argv)


def _optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def _schedule(warmup: int, total: int, floor: float = 0.1) -> Callable[[int], float]:
    """Linear warm-up, then a cosine decay to ``floor`` times the peak learning rate (as the recipe's Trainer run)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = _arguments(argv)
    # before anything loads Intel's bridge; without a Gaudi (and without LIGHTNING_GAUDI_EMULATE) it turns on eager
    # emulation, so the script runs anywhere
    lightning_gaudi.configure()
    backend = hpu.get_backend()
    precision = args.precision or ("32-true" if backend.emulated else "bf16-mixed")
    parallel = args.devices > 1 or args.num_nodes > 1
    fabric = Fabric(
        accelerator="hpu",
        strategy="hpu_parallel" if parallel else "hpu_single",
        devices=args.devices,
        num_nodes=args.num_nodes,
        precision=precision,
    )
    fabric.launch()
    fabric.seed_everything(1234)

    data = StdlibTextDataModule(seq_len=args.seq_len, batch_size=args.batch_size, max_bytes=args.max_bytes)
    data.setup("fit")
    model = GPT(VOCAB_SIZE, block_size=args.seq_len, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    optimizer = _optimizer(model, args.lr)
    model, optimizer = fabric.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(args.warmup_steps, args.steps))
    train_loader, val_loader = fabric.setup_dataloaders(data.train_dataloader(), data.val_dataloader())

    fabric.print(f"{type(fabric.strategy).__name__} on {fabric.world_size} HPU(s), device {fabric.device}, {precision}")
    model.train()
    step = 0
    started = time.perf_counter()
    while step < args.steps:
        for inputs, targets in train_loader:
            loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=1.0, error_if_nonfinite=False)  # no host sync
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                fabric.print(f"step {step}: train loss {loss.item():.3f}")  # the only read of the loss
            if step == args.steps:
                break
    elapsed = time.perf_counter() - started

    model.eval()
    loss_sum = torch.zeros((), device=fabric.device)
    tokens = 0
    with torch.no_grad():  # not inference_mode: lazy emulation's Lazy Tensor Core cannot trace it
        for inputs, targets in islice(val_loader, args.val_batches):
            logits = model(inputs).flatten(0, 1).float()
            loss_sum += F.cross_entropy(logits, targets.flatten(), reduction="sum")
            tokens += targets.numel()
            backend.mark_step()  # lazy mode: run each batch's graph (a no-op in eager and compile mode)
    totals = fabric.all_reduce(torch.stack([loss_sum, loss_sum.new_tensor(float(tokens))]), reduce_op="sum")
    val_loss = float(totals[0] / totals[1])
    results = {
        "train_loss": float(loss.detach()),
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "samples_per_s": args.steps * args.batch_size * fabric.world_size / elapsed,
    }
    path = args.out / "gpt.ckpt"
    fabric.save(path, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": step})
    fabric.print(
        f"val loss {val_loss:.3f}, val ppl {results['val_ppl']:.2f}; {results['samples_per_s']:.1f} samples/s over"
        f" {step} steps; checkpoint: {path}"
    )
    return results


if __name__ == "__main__":
    main()
