"""Runs the benchmark suite: ``python -m benchmarks.run`` from the repository root (see ``benchmarks/README.md``).

Writes ``results.json``, ``results.png`` and ``table.md`` to ``--out`` (default ``benchmarks/results`` for a full run,
``benchmarks/out`` for ``--quick``) and prints the table.
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

SECTIONS = ("overhead", "fused", "ddp", "scaling", "lazy", "threads")
SCHEMA_VERSION = 1
HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None, gaudi: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gaudi" if gaudi else "python -m benchmarks.run",
        description="lightning_gaudi benchmark suite" + (" on a real Gaudi node" if gaudi else " (emulated HPU)"),
    )
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run; its numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None, help="where results.json/.png and table.md go")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections to run (default: all of {SECTIONS})"
    )
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown or not only:
        parser.error(f"--only {args.only!r}: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    if "scaling" in only and "ddp" not in only:
        parser.error("--only: 'scaling' takes its 2-process figures from 'ddp'; add ddp")
    args.only = only
    if args.out is None:
        args.out = HERE / ("out" if args.quick else "results")
    return args


def run_suite(args: argparse.Namespace, gaudi: bool = False) -> dict[str, Any]:
    """Runs the selected sections in one process (the DDP ones launch their own) and returns the results."""
    import torch

    from benchmarks import common

    eager, lazy = (None, None) if gaudi else ("eager", "lazy")
    if not gaudi:
        torch.set_num_threads(1)  # one emulated card per core; several threads on a shared 2-core host only thrash
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "mode": "gaudi" if gaudi else "emulated (eager; lazy for the lazy section)",
        "quick": args.quick,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks." + ("gaudi" if gaudi else "run"), *sys.argv[1:]]),
        "machine": common.machine(),
        "sections": {},
        "section_seconds": {},
    }
    sections = results["sections"]
    for name in SECTIONS:
        if name not in args.only:
            continue
        common.log(f"[{name}]")
        begin = time.perf_counter()
        if name == "overhead":
            from benchmarks import overhead

            sections[name] = overhead.run(args.quick, eager)
        elif name == "fused":
            from benchmarks import fused

            sections[name] = fused.run(args.quick, eager)
        elif name == "ddp":
            from benchmarks import ddp_knobs

            sections[name] = ddp_knobs.run(args.quick, eager)
        elif name == "scaling":
            from benchmarks import scaling

            sections[name] = scaling.run(sections["ddp"], args.quick, eager)
        elif name == "lazy":
            from benchmarks import lazy_mode

            sections[name] = lazy_mode.run(args.quick, lazy)
        elif name == "threads":
            from benchmarks import threads

            sections[name] = threads.run(args.quick, eager)
        results["section_seconds"][name] = time.perf_counter() - begin
    results["duration_s"] = time.perf_counter() - started
    results["machine_at_end"] = {"load_average_1min": common.machine()["load_average_1min"]}
    return results


def write(results: dict[str, Any], out: Path) -> str:
    """Writes results.json, results.png and table.md to ``out``; returns the table."""
    from benchmarks import report

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    text = report.table(results)
    (out / "table.md").write_text(text + "\n")
    if not report.figure(results, out / "results.png"):
        print("matplotlib is not installed: no results.png (pip install matplotlib)", file=sys.stderr)
    return text


def main(argv: list[str] | None = None, gaudi: bool = False) -> int:
    args = parse_args(argv, gaudi)
    if not gaudi and os.environ.get("LIGHTNING_GAUDI_EMULATE", "").strip().lower() not in ("", "eager", "lazy"):
        print("LIGHTNING_GAUDI_EMULATE must be unset, eager or lazy; the suite sets it per section.", file=sys.stderr)
        return 2
    results = run_suite(args, gaudi)
    print(write(results, args.out))
    print(f"\nwrote {args.out / 'results.json'}, results.png, table.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
