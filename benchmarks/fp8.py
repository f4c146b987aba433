"""FP8 training against bf16 and fp32 on the example GPT: loss after N steps and step time.

The example model (``examples/gpt_recipe``: a byte-level GPT, here 2 blocks of width 128 with 64-token contexts) trains
on the standard library's sources for ``--steps`` steps in each precision (``32-true``, ``bf16-mixed``, ``fp8``), from
the same initial weights and the same batches, in rotating order over ``--repeats`` rounds. Reported per precision:
the training loss averaged over the last 10 steps, and the median wall-clock and CPU seconds per step after
``--warmup`` steps; then FP8's loss and step time relative to bf16 and fp32, per round.

Under emulation (the default, ``LIGHTNING_GAUDI_EMULATE=eager``) FP8 is :class:`~lightning_gaudi.fp8.FP8Linear`: its
loss says how FP8 numerics train this model; its step time says only what the emulation costs (a CPU has no FP8
units). On a Gaudi node run ``python -m benchmarks.fp8 --gaudi`` (Intel's bridge, ``te.Linear``): there the step time
is the point.

    python -m benchmarks.fp8              # about 2.5 minutes on 2 shared cores; writes benchmarks/results/fp8.json
    python -m benchmarks.fp8 --quick      # a smoke run; writes benchmarks/out/fp8.json, numbers mean nothing
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

from benchmarks.common import StepTimer, emulation, log, machine, quiet, summarize, trainer_kwargs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))

PRECISIONS = ("32-true", "bf16-mixed", "fp8")
MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 128, "dropout": 0.0, "lr": 3e-3, "warmup_steps": 10}
DATA = {"seq_len": 64, "batch_size": 16, "max_bytes": 600_000, "num_workers": 0}
LAST = 10  # the loss is the mean of the last this many steps


class LossRecorder(Callback):
    """Keeps every training step's loss (on the device; read once at the end)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(outputs["loss"].detach())


def run_one(precision: str, steps: int, warmup: int) -> dict[str, Any]:
    from gpt_recipe.data import StdlibTextDataModule
    from gpt_recipe.model import GPTLanguageModel

    import lightning_gaudi  # noqa: F401 - registers "hpu" and precision="fp8"
    from lightning_gaudi import hpu

    seed_everything(0, verbose=False)
    model = GPTLanguageModel(block_size=DATA["seq_len"], **MODEL)
    data = StdlibTextDataModule(**DATA)
    recorder = LossRecorder()
    timer = StepTimer(warmup, steps - 1, hpu.get_backend().synchronize)
    trainer = Trainer(
        **trainer_kwargs(steps, accelerator="hpu", precision=precision, callbacks=[recorder, timer], max_epochs=-1)
    )
    with quiet():
        trainer.fit(model, datamodule=data)
    losses = torch.stack(recorder.losses).float().cpu()
    return {
        "loss_last": losses[-LAST:].mean().item(),
        "loss_first": losses[:LAST].mean().item(),
        "finite": bool(torch.isfinite(losses).all()),
        "seconds_per_step": 1 / timer.steps_per_second(),
        "cpu_seconds_per_step": 1 / timer.steps_per_cpu_second(),
    }


def run(steps: int, warmup: int, repeats: int, gaudi: bool) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, Any]]] = []
    with emulation(None if gaudi else "eager"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        for repeat in range(repeats):
            order = PRECISIONS[repeat % len(PRECISIONS) :] + PRECISIONS[: repeat % len(PRECISIONS)]
            results = {}
            for precision in order:
                start = time.perf_counter()
                results[precision] = run_one(precision, steps, warmup)
                log(f"  round {repeat} {precision}: {results[precision]} ({time.perf_counter() - start:.1f} s)")
            rounds.append(results)
    summary: dict[str, Any] = {}
    for precision in PRECISIONS:
        summary[precision] = {
            key: summarize([r[precision][key] for r in rounds])
            for key in ("loss_last", "loss_first", "seconds_per_step", "cpu_seconds_per_step")
        }
        summary[precision]["finite"] = all(r[precision]["finite"] for r in rounds)
    for base in ("bf16-mixed", "32-true"):
        summary[f"fp8/{base}"] = {
            key: summarize([r["fp8"][key] / r[base][key] for r in rounds])
            for key in ("loss_last", "seconds_per_step", "cpu_seconds_per_step")
        }
    return {
        "device": "gaudi" if gaudi else "eager emulation",
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "model": MODEL,
        "data": DATA,
        "machine": machine(),
        "rounds": rounds,
        "summary": summary,
    }


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        f"FP8 on the example GPT ({result['device']}, {result['steps']} steps, {result['repeats']} rounds;"
        f" median (min-max))",
        "| precision | loss, last 10 steps | s per step (wall) | s per step (CPU) |",
        "|---|---|---|---|",
    ]

    def cell(v: dict[str, Any], fmt: str) -> str:
        return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"

    for precision in PRECISIONS:
        row = s[precision]
        lines.append(
            f"| {precision} | {cell(row['loss_last'], '.4f')} | {cell(row['seconds_per_step'], '.4f')} |"
            f" {cell(row['cpu_seconds_per_step'], '.4f')} |"
        )
    for base in ("bf16-mixed", "32-true"):
        row = s[f"fp8/{base}"]
        lines.append(
            f"| fp8 / {base} (ratio) | {cell(row['loss_last'], '.4f')} | {cell(row['seconds_per_step'], '.2f')} |"
            f" {cell(row['cpu_seconds_per_step'], '.2f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fp8", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; its numbers mean nothing")
    parser.add_argument("--gaudi", action="store_true", help="run on Intel's bridge (a Gaudi node), not emulated")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (12 if args.quick else 80)
    repeats = args.repeats or 1
    warmup = min(5, steps // 3) if args.quick else 20
    if args.out is None:
        name = "fp8_gaudi.json" if args.gaudi else "fp8.json"
        args.out = HERE / ("out" if args.quick else "results") / name
    result = run(steps, warmup, repeats, args.gaudi)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(table(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
