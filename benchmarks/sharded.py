"""Per-rank memory and speed of the sharded strategies against DDP, 2 processes on the emulated HPU.

``python -m benchmarks.sharded`` (from the repository root) fits a 100.7M-parameter MLP (24 x 2048x2048, AdamW) for a
few steps under each strategy (``hpu_model_parallel`` twice: FSDP2, and tensor parallelism), each in a fresh pair of
processes (see :mod:`benchmarks.sharded_worker`), and writes ``benchmarks/results/sharded.json`` and ``sharded.md``;
``--quick`` runs a small model into ``benchmarks/out/`` (its numbers mean nothing). ``--only ddp,fsdp`` picks
settings.

What is compared is the parameters and optimizer state a rank holds between steps (fp32 weights, AdamW's two
moments, the master copies a strategy keeps), counted from the tensors themselves, so the figure is the same on a
Gaudi; the process's glibc bytes in use (gradients, buffers and communication buckets included) and its peak
resident memory are reported beside it, and steps/s against DDP's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import EMULATE_ENV, log, machine

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
#: (setting, strategy name, strategy arguments beyond the name's); ``wrap_linear`` wraps each Linear in FSDP; ``plan``
#: is the model's plan under ``hpu_model_parallel`` (``fsdp2``: ``fully_shard`` each Linear, then the root; ``tp``:
#: the Linears alternately column- and row-wise; see :class:`benchmarks.sharded_worker.WideMLPParallel`).
SETTINGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ddp", "hpu_parallel", {}),
    ("fsdp", "hpu_fsdp", {"wrap_linear": True}),
    ("zero1", "hpu_deepspeed_stage_1", {}),
    ("zero2", "hpu_deepspeed_stage_2", {}),
    ("zero3", "hpu_deepspeed_stage_3", {}),
    ("fsdp2", "hpu_model_parallel", {"data_parallel_size": 2, "tensor_parallel_size": 1, "plan": "fsdp2"}),
    ("tp", "hpu_model_parallel", {"data_parallel_size": 1, "tensor_parallel_size": 2, "plan": "tp"}),
)
#: Settings that shard the parameters as well as the optimizer state, and the target for their state per rank.
FULLY_SHARDED = ("fsdp", "zero3", "fsdp2", "tp")
STATE_TARGET = 0.55
FULL = {"width": 2048, "layers": 24, "batch": 8, "steps": 6, "warmup": 2}
QUICK = {"width": 256, "layers": 4, "batch": 8, "steps": 4, "warmup": 1}
GIB = 1024**3
#: glibc's mmap threshold at 1 MiB: each tensor above it is its own mapping, counted while held, returned when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)}


def launch(spec: dict[str, Any], timeout: float = 900) -> list[dict[str, Any]]:
    """Runs :mod:`benchmarks.sharded_worker` with ``spec`` in fresh processes; returns each rank's figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_GAUDI_")}
    env.update(MALLOC_ENV)
    env[EMULATE_ENV] = "eager"
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, "-m", "benchmarks.sharded_worker", str(spec_path), tmp]
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{spec['name']}: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(spec["devices"])]


def summarize(ranks: list[dict[str, Any]], ddp: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one setting: maxima over ranks, and ratios to DDP's where DDP ran."""
    row: dict[str, Any] = {
        key: max(rank[key] for rank in ranks)
        for key in ("parameter_bytes", "optimizer_bytes", "state_bytes", "malloc_in_use_bytes", "peak_rss_bytes")
    }
    row["steps_per_s"] = min(rank["steps_per_s"] for rank in ranks)
    row["parameters"] = ranks[0]["parameters"]
    if ddp is not None:
        row["state_vs_ddp"] = row["state_bytes"] / ddp["state_bytes"]
        row["in_use_vs_ddp"] = row["malloc_in_use_bytes"] / ddp["malloc_in_use_bytes"]
        row["speed_vs_ddp"] = row["steps_per_s"] / ddp["steps_per_s"]
    return row


def table(results: dict[str, Any]) -> str:
    """The Markdown table of ``results``."""
    lines = [
        "| setting | strategy | params + optimizer state per rank (GiB) | vs DDP | target | glibc in use (GiB) |"
        " vs DDP | peak RSS (GiB) | steps/s | vs DDP |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["settings"].items():
        ratio = row.get("state_vs_ddp")
        target = f"<= {STATE_TARGET}" if name in FULLY_SHARDED else ""
        met = "" if not target or ratio is None else (" (met)" if ratio <= STATE_TARGET else " (NOT met)")
        lines.append(
            f"| {name} | {row['strategy']} | {row['state_bytes'] / GIB:.3f} | {_ratio(ratio)} | {target}{met} |"
            f" {row['malloc_in_use_bytes'] / GIB:.3f} | {_ratio(row.get('in_use_vs_ddp'))} |"
            f" {row['peak_rss_bytes'] / GIB:.3f} | {row['steps_per_s']:.2f} | {_ratio(row.get('speed_vs_ddp'))} |"
        )
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    names = [name for name, _, _ in SETTINGS]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model; its numbers mean nothing")
    parser.add_argument("--only", default=",".join(names), help=f"comma-separated settings (default: {names})")
    parser.add_argument("--out", type=Path, default=None, help="where sharded.json and sharded.md go")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(names))
    if unknown or not only:
        parser.error(f"--only {args.only!r}: unknown setting(s) {unknown}; choose from {', '.join(names)}")
    out = args.out or HERE / ("out" if args.quick else "results")
    shape = QUICK if args.quick else FULL
    results: dict[str, Any] = {"quick": args.quick, "model": shape, "machine": machine(), "settings": {}}
    started = time.perf_counter()
    ddp: dict[str, Any] | None = None
    for name, strategy, kwargs in SETTINGS:
        if name not in only:
            continue
        log(f"sharded: {name} ({strategy}) ...")
        spec = {"name": name, "strategy": strategy, "strategy_kwargs": kwargs, "devices": 2, **shape}
        row = {"strategy": strategy, **summarize(launch(spec), ddp)}
        results["settings"][name] = row
        if name == "ddp":
            ddp = row
    results["seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "sharded.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    (out / "sharded.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
