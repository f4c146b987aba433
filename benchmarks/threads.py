"""Torch threads on the emulated HPU: the README's main job (the example GPT of ``examples/gpt_recipe``, as
``conf/`` composes it) in eager emulation with ``torch.set_num_threads(n)`` for each ``n``.

One process; the variants alternate in rotating order and each fit is timed over the same window of training
steps (after a warm-up). Beside steps per wall-clock second: steps per CPU-second of the process (what a step costs,
all threads together), CPU utilization (CPU time over wall time: how many cores the process kept busy) and the
1-minute load average at the start and end of each fit, since on a shared host the other work decides how much a
second thread can get.

    python -m benchmarks.threads                          # n = 1 and the core count, 60 timed steps each
    python -m benchmarks.threads --threads 1,2,4 --steps 60 --repetitions 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import StepTimer, emulation, gaudi_callbacks, log, machine, quiet, summarize, trainer_kwargs

ROOT = Path(__file__).resolve().parent.parent
#: The steps a thread count takes to settle (allocator, first AdamW step) before the timed window (1 under quick).
WARMUP = 5


def _recipe() -> tuple[Any, int, int]:
    """The example GPT as the README's command builds it, and its batch size and sequence length."""
    from hydra import compose, initialize_config_dir

    import lightning_gaudi.hydra  # noqa: F401 - the schemas and resolvers the recipes use

    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))  # gpt_recipe, as examples/train.py imports it
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=["paths.output_dir=."])
    return cfg.model, int(cfg.data.batch_size), int(cfg.data.seq_len)


def _loader(batches: int, batch_size: int, seq_len: int) -> torch.utils.data.DataLoader:
    """Random bytes in the recipe's shapes: the same work per step as the standard-library text, without reading it."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (batches * batch_size, seq_len + 1), generator=generator)
    dataset = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True)


def _fit(model_cfg: Any, batch_size: int, seq_len: int, threads: int, steps: int, warmup: int) -> dict[str, float]:
    from hydra.utils import instantiate
    from lightning.pytorch import Trainer, seed_everything

    torch.set_num_threads(threads)
    seed_everything(0, verbose=False)
    timer = StepTimer(warmup, warmup + steps - 1)
    callbacks = [*gaudi_callbacks()[1], timer]
    load_before = os.getloadavg()[0]
    with quiet():
        trainer = Trainer(**trainer_kwargs(warmup + steps, accelerator="hpu", callbacks=callbacks))
        trainer.fit(instantiate(model_cfg), _loader(warmup + steps, batch_size, seq_len))
    return {
        "steps_per_s": timer.steps_per_second(),
        "steps_per_cpu_s": timer.steps_per_cpu_second(),
        "cpu_utilization": timer.cpu_utilization(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def run(
    quick: bool = False,
    mode: str | None = "eager",
    threads: tuple[int, ...] | None = None,
    steps: int | None = None,
    repetitions: int = 1,
) -> dict[str, Any]:
    """Times the example GPT with each thread count and returns steps/s per count and the ratios to one thread.

    Args:
        quick: a seconds-long smoke run (numbers meaningless).
        mode: ``"eager"`` or ``"lazy"`` emulation, or ``None`` for a real Gaudi (where threads only feed the host).
        threads: the thread counts to compare (default: 1 and the number of usable cores).
        steps: timed steps per fit (default 60; 3 under ``quick``).
        repetitions: fits per thread count (the counts alternate in rotating order).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = tuple(threads or sorted({1, cores}))
    if any(n < 1 for n in counts):
        raise ValueError(f"thread counts must be positive, got {counts}")
    steps = steps or (3 if quick else 60)
    warmup = 1 if quick else WARMUP
    before = torch.get_num_threads()
    model_cfg, batch_size, seq_len = _recipe()
    measured: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    try:
        with emulation(mode):
            from lightning_gaudi import hpu

            hpu.get_backend()  # created once, before the first count is set
            for repetition in range(1 if quick else repetitions):
                shift = repetition % len(counts)
                for n in counts[shift:] + counts[:shift]:
                    result = _fit(model_cfg, batch_size, seq_len, n, steps, warmup)
                    measured[n].append(result)
                    log(
                        f"  threads rep {repetition + 1} n={n}: {result['steps_per_s']:5.2f} steps/s,"
                        f" {result['steps_per_cpu_s']:5.2f} steps/CPU-s, {result['cpu_utilization']:.2f} cores busy,"
                        f" load {result['load_before']:.1f} -> {result['load_after']:.1f}"
                    )
    finally:
        torch.set_num_threads(before)
    per_count = {
        str(n): {key: summarize([r[key] for r in results]) for key in results[0]} for n, results in measured.items()
    }
    one = per_count.get("1")
    return {
        "model": {key: model_cfg[key] for key in ("n_layer", "n_head", "n_embd")},
        "batch_size": batch_size,
        "seq_len": seq_len,
        "steps": steps,
        "warmup_steps": warmup,
        "threads": list(counts),
        "per_threads": per_count,
        "speed_vs_one_thread": (
            {
                str(n): per_count[str(n)]["steps_per_s"]["median"] / one["steps_per_s"]["median"]
                for n in counts
                if n != 1
            }
            if one is not None
            else {}
        ),
    }


def table(result: dict[str, Any], machine_info: dict[str, Any]) -> str:
    """A Markdown table of the result, with the machine line."""
    lines = [
        "| torch threads | steps/s | steps per CPU-second | cores busy | load average (start -> end) |",
        "|---|---|---|---|---|",
    ]
    for n, row in result["per_threads"].items():
        lines.append(
            f"| {n} | {row['steps_per_s']['median']:.2f} | {row['steps_per_cpu_s']['median']:.2f}"
            f" | {row['cpu_utilization']['median']:.2f} | {row['load_before']['median']:.1f} ->"
            f" {row['load_after']['median']:.1f} |"
        )
    model = result["model"]
    lines.append("")
    lines.append(
        f"The example GPT ({model['n_layer']} layers, width {model['n_embd']}), batch {result['batch_size']} x"
        f" {result['seq_len']} tokens, eager emulation, the Gaudi default callbacks; {result['steps']} timed steps"
        f" after {result['warmup_steps']}, medians. Machine: {machine_info['usable_cores']} usable cores"
        f" ({machine_info['cpu']}), torch {machine_info['torch']}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and the cores)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per fit (default 60)")
    parser.add_argument("--repetitions", type=int, default=1, help="fits per thread count (default 1)")
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run; its numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        counts = tuple(int(n) for n in args.threads.split(",")) if args.threads else None
    except ValueError:
        parser.error(f"--threads {args.threads!r} must be comma-separated whole numbers, e.g. 1,2")
    if counts is not None and any(n < 1 for n in counts):
        parser.error(f"--threads {args.threads!r}: every count must be at least 1")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps} must be at least 1")
    if args.repetitions < 1:
        parser.error(f"--repetitions {args.repetitions} must be at least 1")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_gaudi"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    info = machine()
    result = run(args.quick, "eager", counts, args.steps, args.repetitions)
    print(table(result, info))
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": info, "threads": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
