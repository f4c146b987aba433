"""``python -m benchmarks.warm_start [--cards 1 2] [--steps 8]``: how fast the main job (``examples/train.py``,
compile mode, ``ckpt_path=auto``) takes its first step cold and requeued, under the compile cache policy
(``lightning_gaudi.compile_cache``).

Per card count, in one run folder: ``cold`` (a fresh temp directory, so an empty policy folder), ``same_node`` (the
same temp directory: torch's caches still there), ``other_node`` (a fresh temp directory: only what the run folder
holds beside its checkpoints), ``other_node_off`` (the same with the policy off: what the job did before it), each
requeue resuming the last and training ``--steps`` more; then ``cold_again`` in a fresh run folder and temp
directory, the A/A control of ``cold``, and ``cold_every_rank``, the same with ``HPUCompile(once_per_node=False)``
(each rank compiles every graph itself). For each: seconds from the process start to the
first training step done, the first step, the median steady step (the steps after the second), and the graphs each
rank compiled (dynamo frames) beside the FX graph and AOTAutograd cache hits, misses and bypasses of rank 0. Writes
``results/warm_start.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.common import child_env, machine, machine_line

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("cold", "same_node", "other_node", "other_node_off", "cold_again", "cold_every_rank")


class StepClock(Callback):
    """Writes each training step's wall-clock end (and rank 0's compile counters) to ``path`` at the end of fit."""

    def __init__(self, path: str) -> None:
        self.path, self.ends = path, []  # type: ignore[var-annotated]
        self.start = 0.0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self.ends:
            self.start = time.time()

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.ends.append(time.time())

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from torch._dynamo.utils import counters

        record = {
            "first_start": self.start,
            "ends": self.ends,
            "frames": int(counters["stats"]["unique_graphs"]),
            "fxgraph": {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
            "aot": {k: int(v) for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
        }
        Path(f"{self.path}.rank{trainer.global_rank}").write_text(json.dumps(record))


def run(
    cards: int, steps: int, run_dir: Path, tmp: Path, clock: Path, policy: bool = True, every_rank: bool = False
) -> dict[str, Any]:
    """One job of ``steps`` more steps in ``run_dir`` with ``tmp`` as its temp directory; its timings."""
    done_before = run_dir / "steps.json"
    total = (json.loads(done_before.read_text()) if done_before.exists() else 0) + steps
    args = [
        "examples/train.py",
        "runtime.execution_mode=compile",
        f"trainer.max_steps={total}",
        f"paths.output_dir={run_dir}",
        "logger=none",
        "+callbacks.step_clock._target_=benchmarks.warm_start.StepClock",
        f"+callbacks.step_clock.path={clock}",
    ]
    if cards > 1:
        args += ["strategy=hpu_parallel", f"trainer.devices={cards}"]
    if every_rank:
        args += [
            "+callbacks.hpu_compile._target_=lightning_gaudi.callbacks.HPUCompile",
            "+callbacks.hpu_compile.once_per_node=false",
        ]
    env = child_env(TMPDIR=str(tmp), LIGHTNING_GAUDI_EMULATE="eager", PYTHONPATH=str(ROOT))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if not policy:
        env["LIGHTNING_GAUDI_COMPILE_CACHE"] = "off"
    start = time.time()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{args} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    done_before.write_text(json.dumps(total))
    ranks = [json.loads(Path(f"{clock}.rank{rank}").read_text()) for rank in range(cards)]
    ends = ranks[0]["ends"]
    durations = [b - a for a, b in zip([ranks[0]["first_start"], *ends[:-1]], ends, strict=True)]
    return {
        "start_to_first_step_s": ends[0] - start,
        "first_step_s": durations[0],
        "steady_step_s": statistics.median(durations[2:]),
        "total_s": time.time() - start,
        "frames_per_rank": [rank["frames"] for rank in ranks],
        "fxgraph": [rank["fxgraph"] for rank in ranks],
        "aot": ranks[0]["aot"],
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "# Warm start: the main job in compile mode, cold and requeued (`python -m benchmarks.warm_start`)",
        "",
        machine_line(results["machine"]),
        "",
        "| cards | run | start -> first step done | first step | steady step | first / steady | graphs compiled"
        " (dynamo frames, per rank) | FX graph cache (per rank) | AOTAutograd cache (rank 0) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cards, runs in results["runs"].items():
        for name, r in runs.items():
            lines.append(
                f"| {cards} | {name} | {r['start_to_first_step_s']:.1f} s | {r['first_step_s']:.2f} s |"
                f" {r['steady_step_s']:.2f} s | {r['first_step_s'] / r['steady_step_s']:.1f}x |"
                f" {r['frames_per_rank']} | {'; '.join(map(_counts, r['fxgraph']))} | {_counts(r['aot'])} |"
            )
    return "\n".join(lines) + "\n"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.rsplit('_', 1)[-1]} {v}" for k, v in sorted(counts.items())) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=SCENARIOS, help="scenarios to run, in order")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": machine(), "steps": args.steps, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="warm_start_") as scratch:
        base = Path(scratch)
        for cards in args.cards:
            runs = results["runs"][str(cards)] = {}
            run_dir, again_dir = base / f"run{cards}", base / f"again{cards}"
            tmps = {name: base / f"tmp{cards}_{name}" for name in ("first", "other", "off", "again", "every")}
            for tmp in tmps.values():
                tmp.mkdir()
            plan = {
                "cold": (run_dir, tmps["first"]),
                "same_node": (run_dir, tmps["first"]),
                "other_node": (run_dir, tmps["other"]),
                "other_node_off": (run_dir, tmps["off"]),
                "cold_again": (again_dir, tmps["again"]),
                "cold_every_rank": (base / f"every{cards}", tmps["every"]),
            }
            for name, (folder, tmp) in ((name, plan[name]) for name in args.only):
                clock = base / f"clock{cards}_{name}"
                policy, every_rank = name != "other_node_off", name == "cold_every_rank"
                runs[name] = run(cards, args.steps, folder, tmp, clock, policy=policy, every_rank=every_rank)
                print(f"{cards} card(s), {name}: {runs[name]}", file=sys.stderr, flush=True)
                text = write(results, args.out)  # after each run: a long run cut short keeps what it measured
    print(text)
    return 0


def write(results: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "warm_start.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (out / "warm_start.md").write_text(text)
    return text


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
