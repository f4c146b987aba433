"""DDP step time, 2 processes: ``hpu_parallel`` (preemption on, and off) against stock Lightning DDP on the CPU.

``python -m benchmarks.ddp_overhead [--rounds N] [--steps N] [--out DIR]``. Each variant is a fresh pair of processes
(Lightning's popen launcher) training a tiny MLP (the step is mostly the framework's own per-step work, which is what
is compared); the variants alternate in rotating order for ``rounds`` rounds; ``stock_again`` repeats ``stock`` as
an A/A control, so the spread of ``stock / stock_again`` is the noise floor. Writes ``ddp_overhead.json`` and
``ddp_overhead.md`` (default: ``benchmarks/results``). The target (issue 25): ``hpu_parallel`` with preemption on at
least 1.15x stock DDP's steps/s.

Run a worker by hand: ``python -m benchmarks.ddp_overhead --worker VARIANT STEPS OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

VARIANTS = ("stock", "plugin", "plugin_preemption_off", "stock_again")
#: What ``--quick`` (a smoke run of the suite) runs: one pair of processes per code path the full run compares.
QUICK_VARIANTS = ("stock", "plugin")
WARMUP = 20
RESULTS = Path(__file__).parent / "results"


def worker(variant: str, steps: int, out: Path) -> None:
    import torch
    from lightning.pytorch import LightningModule, Trainer, seed_everything
    from torch import nn

    from benchmarks.common import StepTimer, quiet, trainer_kwargs

    class TinyMLP(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    seed_everything(0, verbose=False)
    x = torch.randn(steps * 2 * 8, 32)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    timer = StepTimer(warmup=WARMUP, last=steps - 1)
    callbacks: list[Any] = [timer]
    if variant.startswith("stock"):
        kwargs = {"accelerator": "cpu", "strategy": "ddp"}
    else:
        import lightning_gaudi
        from lightning_gaudi.callbacks import PreemptionCheckpoint

        lightning_gaudi.configure(emulate=True, execution_mode="eager")
        kwargs = {"accelerator": "hpu", "strategy": "hpu_parallel"}
        if variant == "plugin_preemption_off":
            callbacks.append(PreemptionCheckpoint(enabled=False))
    settings = trainer_kwargs(steps, devices=2, enable_progress_bar=False, log_every_n_steps=50)
    trainer = Trainer(callbacks=callbacks, **settings, **kwargs)
    with warnings.catch_warnings(), quiet():
        warnings.simplefilter("ignore")
        trainer.fit(TinyMLP(), loader)
    if trainer.global_rank == 0:
        out.write_text(json.dumps({"steps_per_second": timer.steps_per_second()}))


def run(rounds: int, steps: int, out_dir: Path, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    from benchmarks.common import child_env, machine, ratio_summary, rotation, run_worker, summarize

    out_dir.mkdir(parents=True, exist_ok=True)
    env = child_env()
    measured: dict[str, list[float]] = {variant: [] for variant in variants}
    for index in range(rounds):
        for variant in rotation(variants, index):
            result = out_dir / f"{variant}.json"
            value = run_worker("benchmarks.ddp_overhead", [variant, str(steps), str(result)], result, env)
            measured[variant].append(value["steps_per_second"])
            print(f"round {index + 1} {variant}: {measured[variant][-1]:.1f} steps/s", file=sys.stderr, flush=True)
    results = {
        "machine": machine(),
        "rounds": rounds,
        "steps": steps,
        "warmup": WARMUP,
        "steps_per_second": {variant: summarize(values) for variant, values in measured.items()},
        "vs_stock": {
            variant: ratio_summary(measured[variant], measured["stock"]) for variant in variants if variant != "stock"
        },
    }
    (out_dir / "ddp_overhead.json").write_text(json.dumps(results, indent=2))
    (out_dir / "ddp_overhead.md").write_text(table(results))
    return results


def table(results: dict[str, Any]) -> str:
    from benchmarks.common import fmt_summary

    machine = results["machine"]
    lines = [
        f"2 processes, tiny MLP, {results['steps']} steps ({results['warmup']} warm-up), {results['rounds']} rounds;"
        f" {machine['cpu']}, {machine['usable_cores']} cores, torch {machine['torch']}, Lightning"
        f" {machine['lightning']}, load {machine['load_average_1min']:.1f}",
        "",
        "| variant | steps/s (median, min-max) | vs stock DDP (median, min-max) |",
        "|---|---|---|",
    ]
    for variant, speed in results["steps_per_second"].items():
        ratio = results["vs_stock"].get(variant)
        lines.append(f"| `{variant}` | {fmt_summary(speed)} | {fmt_summary(ratio, '.2f') if ratio else '1'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "STEPS", "OUT"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.worker:
        variant, steps, out = args.worker
        worker(variant, int(steps), Path(out))
        return
    print(table(run(args.rounds, args.steps, args.out)))


if __name__ == "__main__":
    main()
