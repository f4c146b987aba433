"""Runs the benchmark suite: ``python -m benchmarks.run`` from the repository root (see ``benchmarks/README.md``).

Two sections: ``overhead`` (one process: the plugin against stock Lightning and a hand-written loop) and ``ddp`` (two
processes: ``hpu_parallel`` against stock Lightning DDP, :mod:`benchmarks.ddp_overhead`). Writes ``results.json`` and
``table.md`` (and the ``ddp`` section's ``ddp_overhead.json``/``.md``) to ``--out`` (default ``benchmarks/results``
for a full run, ``benchmarks/out`` for ``--quick``) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

SECTIONS = ("overhead", "ddp")
SCHEMA_VERSION = 2
HERE = Path(__file__).resolve().parent
#: What the "met" column says under ``--quick``: a smoke run's numbers mean nothing, so no target is judged.
NOT_JUDGED = "not judged (--quick)"


def parse_args(argv: list[str] | None = None, gaudi: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gaudi" if gaudi else "python -m benchmarks.run",
        description="lightning_gaudi benchmark suite" + (" on a real Gaudi node" if gaudi else " (emulated HPU)"),
    )
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run; its numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None, help="where results.json and table.md go")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections to run (default: all of {SECTIONS})"
    )
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only {args.only!r}: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    args.only = only
    if args.out is None:
        args.out = HERE / ("out" if args.quick else "results")
    return args


def run_suite(args: argparse.Namespace, gaudi: bool = False) -> dict[str, Any]:
    """Runs the selected sections (the DDP one launches its own processes) and returns the results."""
    import torch

    from benchmarks import common

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "mode": "gaudi" if gaudi else "emulated (eager)",
        "quick": args.quick,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks." + ("gaudi" if gaudi else "run"), *sys.argv[1:]]),
        "machine": common.machine(),
        "sections": {},
    }
    if "overhead" in args.only:
        from benchmarks import overhead

        common.log("[overhead]")
        results["sections"]["overhead"] = overhead.run(args.quick, None if gaudi else "eager")
    if "ddp" in args.only:
        from benchmarks import ddp_overhead

        common.log("[ddp]")
        quick = (1, 30, ddp_overhead.QUICK_VARIANTS)
        rounds, steps, variants = quick if args.quick else (4, 400, ddp_overhead.VARIANTS)
        results["sections"]["ddp"] = ddp_overhead.run(rounds, steps, args.out, variants)
    results["duration_s"] = time.perf_counter() - started
    return results


def _spread(summary: dict[str, Any], fmt: str = ".3f") -> str:
    return f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}})"


#: The overhead ratios the table shows.
RATIOS = {
    "plugin/stock": "plugin / stock Lightning",
    "plugin/stock_bar20": "plugin / stock Lightning with the plugin's bar rate (20)",
    "plugin_gaudi_set/stock": "plugin + Gaudi set / stock Lightning",
    "plugin/hand": "plugin / hand loop",
    "stock_again/stock": "A/A control: stock Lightning / stock Lightning",
}


def table(results: dict[str, Any]) -> str:
    """A Markdown table of every figure, medians with (min-max) over repetitions, and the machine line; under
    ``--quick`` the targets are listed but not judged."""
    rows: list[tuple[str, str, str, str]] = []
    overhead, ddp = results["sections"].get("overhead"), results["sections"].get("ddp")
    if overhead is not None:
        for name in overhead["steps_per_s"]:
            cpu, wall = overhead["steps_per_cpu_s"][name], overhead["steps_per_s"][name]
            speeds = f"{_spread(cpu, '.1f')} / {_spread(wall, '.1f')}"
            rows.append((f"overhead: {name}, steps per CPU-second / per wall-second", speeds, "", ""))
        share = overhead["plugin_code"]
        rows.append(
            (
                "overhead: time in lightning_gaudi's own code, share of a profiled plugin fit",
                f"{share['plugin_share']:.2%} ({share['plugin_seconds'] * 1e6 / share['steps']:.0f} us per step)",
                "",
                "",
            )
        )
        for key, label in RATIOS.items():
            if key not in overhead["ratios"]:
                continue
            met = NOT_JUDGED if results["quick"] else ("yes" if overhead["met"] else "**no**")
            target, met = (">= 0.99 (CPU-time median)", met) if key == "plugin/stock" else ("", "")
            ratios = f"{_spread(overhead['ratios'][key])} / {_spread(overhead['ratios_wall'][key])}"
            rows.append((f"overhead: {label}, CPU time / wall clock", ratios, target, met))
    if ddp is not None:
        for variant, ratio in ddp["vs_stock"].items():
            rows.append((f"ddp (2 processes): {variant} / stock Lightning DDP, steps/s", _spread(ratio), "", ""))
    m = results["machine"]
    lines = ["| measurement | result: median (min-max) | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines.append("")
    lines.append(
        f"Machine: {m['cores']} cores ({m['cpu']}), torch {m['torch']}, Lightning {m['lightning']}, Python"
        f" {m['python']}, {m['torch_threads']} torch thread(s) per process, load average at start"
        f" {m['load_average_1min']:.1f}; mode: {results['mode']}; suite took {results['duration_s']:.0f} s"
        f" ({'quick' if results['quick'] else 'full'} run, {results['started_utc']})."
    )
    if results["quick"]:
        lines += ["", "A quick run is a smoke test: its numbers mean nothing, so no target is judged."]
    return "\n".join(lines)


def write(results: dict[str, Any], out: Path) -> str:
    """Writes results.json and table.md to ``out``; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    text = table(results)
    (out / "table.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None, gaudi: bool = False) -> int:
    args = parse_args(argv, gaudi)
    if not gaudi and os.environ.get("LIGHTNING_GAUDI_EMULATE", "").strip().lower() not in ("", "eager"):
        print("LIGHTNING_GAUDI_EMULATE must be unset or eager; the suite sets it.", file=sys.stderr)
        return 2
    results = run_suite(args, gaudi)
    print(write(results, args.out))
    print(f"\nwrote {args.out / 'results.json'} and table.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
