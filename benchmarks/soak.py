"""A soak per strategy family: 2 emulated cards train for a given time with a checkpoint every few steps, and each
rank's resident memory, open file descriptors and threads are sampled; they should stay flat.

``python -m benchmarks.soak [--families ddp fsdp zero model_parallel] [--duration S] [--every N] [--out FILE]``
runs each family in turn (``ddp``: ``hpu_parallel``; ``fsdp``: ``hpu_fsdp``; ``zero``: ``hpu_deepspeed_stage_2``,
skipped without DeepSpeed; ``model_parallel``: ``hpu_model_parallel``, tensor parallel over the 2 cards), ``S``
seconds each (``Trainer(max_time=...)``), saving ``last.ckpt`` and the newest step checkpoint every ``N`` steps
(each save replaces the previous files). Every rank samples ``/proc/self`` after each save (then the heap has settled
for a moment) and writes its samples; the first quarter of the run is the warm-up (allocator pools, the first saves).
The report gives, per family and rank, the change from the end of the warm-up to the last sample and a least-squares
slope of resident memory over the rest. Run under ``LIGHTNING_GAUDI_EMULATE=eager`` (the default here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FAMILIES = {
    "ddp": "hpu_parallel",
    "fsdp": "hpu_fsdp",
    "zero": "hpu_deepspeed_stage_2",
    "model_parallel": "hpu_model_parallel",
}
ROOT = Path(__file__).resolve().parent.parent


def process_sample() -> dict[str, float]:
    """This process's resident memory (MiB), open file descriptors and threads, from ``/proc/self``."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(status["Threads"]),
    }


def _worker(family: str, duration: float, every: int, out: Path) -> None:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_gaudi  # noqa: F401  # registers the HPU strategies

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))

        def configure_model(self) -> None:
            if family == "model_parallel":
                from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

                plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
                parallelize_module(self.net, self.device_mesh["tensor_parallel"], plan)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Sampler(Callback):
        def __init__(self) -> None:
            self.samples: list[dict[str, float]] = []
            self.start = time.monotonic()

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            self.samples.append({"t": time.monotonic() - self.start, "step": trainer.global_step, **process_sample()})

    seed_everything(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 8))
    sampler = Sampler()
    kwargs: dict[str, Any] = {"tensor_parallel_size": 2} if family == "model_parallel" else {}
    strategy: Any = FAMILIES[family]
    if kwargs:
        from lightning_gaudi import HPUModelParallelStrategy

        strategy = HPUModelParallelStrategy(data_parallel_size=1, **kwargs)
    checkpoint = ModelCheckpoint(dirpath=out / family, every_n_train_steps=every, save_last=True, save_top_k=1)
    trainer = Trainer(
        accelerator="hpu",
        devices=2,
        strategy=strategy,
        max_time={"seconds": duration},
        max_epochs=-1,
        callbacks=[checkpoint, sampler],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=32, shuffle=True))
    result = {"family": family, "steps": trainer.global_step, "samples": sampler.samples}
    (out / f"{family}.rank{trainer.global_rank}.json").write_text(json.dumps(result))


def _change(samples: list[dict[str, float]]) -> dict[str, Any]:
    """From the end of the warm-up (the first quarter) to the last sample; the slope of RSS over that part."""
    rest = [s for s in samples if s["t"] >= samples[-1]["t"] / 4] or samples[-1:]
    first, last = rest[0], rest[-1]
    ts, rss = [s["t"] for s in rest], [s["rss_mib"] for s in rest]
    mean_t, mean_r = sum(ts) / len(ts), sum(rss) / len(rss)
    var = sum((t - mean_t) ** 2 for t in ts)
    slope = sum((t - mean_t) * (r - mean_r) for t, r in zip(ts, rss, strict=True)) / var if var else 0.0
    return {
        "samples": len(samples),
        "rss_mib": [round(first["rss_mib"], 1), round(last["rss_mib"], 1)],
        "rss_slope_mib_per_min": round(slope * 60, 2),
        "fds": [first["fds"], last["fds"]],
        "threads": [first["threads"], last["threads"]],
    }


def soak(family: str, duration: float, every: int, out: Path) -> dict[str, Any]:
    """Runs one family's soak (a fresh 2-rank job) and returns its summary per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "SLURM_", "LOCAL_RANK", "WORLD_"))}
    env.setdefault("LIGHTNING_GAUDI_EMULATE", "eager")
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "benchmarks.soak", "--worker", family, str(duration), str(every), str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=duration + 600)
    ranks = [out / f"{family}.rank{rank}.json" for rank in range(2)]
    if done.returncode != 0 or not all(r.exists() for r in ranks):
        raise RuntimeError(f"the {family} soak failed ({done.returncode}):\n{done.stderr[-3000:]}")
    results = [json.loads(r.read_text()) for r in ranks]
    return {"steps": results[0]["steps"], "ranks": [_change(r["samples"]) for r in results]}


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        family, duration, every, out = sys.argv[2:6]
        _worker(family, float(duration), int(every), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of training per family")
    parser.add_argument("--every", type=int, default=20, help="a checkpoint every N steps")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lightning_gaudi_soak"))
    args = parser.parse_args()
    if args.duration <= 0 or args.every < 1:
        parser.error(f"--duration {args.duration} and --every {args.every} must be positive")
    results: dict[str, Any] = {"duration_s": args.duration, "every_n_steps": args.every, "families": {}}
    for family in args.families:
        if family == "zero" and not _has_deepspeed():
            print("zero: skipped (DeepSpeed is not installed)", file=sys.stderr)
            continue
        args.workdir.mkdir(parents=True, exist_ok=True)
        results["families"][family] = soak(family, args.duration, args.every, args.workdir)
        print(family, json.dumps(results["families"][family]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


def _has_deepspeed() -> bool:
    from lightning_utilities.core.imports import RequirementCache

    return bool(RequirementCache("deepspeed"))


if __name__ == "__main__":
    main()
