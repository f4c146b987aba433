#!/usr/bin/env python3
"""Gathers a Hydra sweep's results into a table (Markdown on stdout, CSV) and a PNG plot of throughput.

    python scripts/sweep_report.py logs/bucket_sweep/multiruns/<id>
    python scripts/sweep_report.py logs/bucket_sweep/multiruns          # the newest sweep there
    python scripts/sweep_report.py SWEEP_DIR --param strategy.bucket_cap_mb --metric tokens_per_sec

Each job folder of the sweep holds ``.hydra/overrides.yaml`` (what the job was given) and, when it finished,
``results.json`` (written by ``examples/train.py``). The swept parameters are the overrides whose values differ
between jobs. Writes ``sweep_report.csv`` and ``sweep_report.png`` into the sweep folder (or ``--out``).
Needs matplotlib for the plot (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

METRICS = ("samples_per_sec", "tokens_per_sec", "val/ppl", "val/loss", "peak_memory_gib")


def _parse_value(text: str) -> Any:
    value = yaml.safe_load(text)
    return value if isinstance(value, (int, float, bool)) or value is None else str(text)


def read_job(job_dir: Path) -> dict[str, Any]:
    """One job's overrides (``key -> value``) and results (``None`` when the job did not finish)."""
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    overrides: dict[str, Any] = {}
    for item in yaml.safe_load(overrides_file.read_text()) or []:
        key, _, value = str(item).partition("=")
        overrides[key.lstrip("+~")] = _parse_value(value)
    results_file = job_dir / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else None
    return {"job": job_dir.name, "overrides": overrides, "results": results}


def find_sweep(path: Path) -> Path:
    """``path`` itself, or the newest sweep in it when it is a folder of sweeps (``logs/<task>/multiruns``)."""
    if path.is_dir() and not any(path.glob("*/.hydra/overrides.yaml")):
        sweeps = sorted((p.parent for p in path.glob("*/multirun.yaml")), key=lambda p: p.stat().st_mtime)
        if sweeps:
            return sweeps[-1]
    return path


def read_sweep(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every job of the sweep under ``sweep_dir``, in job-number order.

    Raises:
        FileNotFoundError: ``sweep_dir`` does not exist or holds no Hydra job folders.
    """
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"No sweep folder at {str(sweep_dir)!r}; pass the folder Hydra printed for the sweep.")
    jobs = [read_job(path.parent.parent) for path in sweep_dir.glob("*/.hydra/overrides.yaml")]
    if not jobs:
        raise FileNotFoundError(
            f"{str(sweep_dir)!r} holds no job folders (<n>/.hydra/overrides.yaml): is it a multirun folder"
            " (logs/<task>/multiruns/<id>)?"
        )
    return sorted(
        jobs, key=lambda job: (not job["job"].isdigit(), int(job["job"]) if job["job"].isdigit() else 0, job["job"])
    )


def swept_params(jobs: list[dict[str, Any]]) -> list[str]:
    """The override keys whose values differ between jobs, in first-seen order."""
    keys: dict[str, None] = {}
    for job in jobs:
        keys.update(dict.fromkeys(job["overrides"]))
    return [key for key in keys if len({repr(job["overrides"].get(key)) for job in jobs}) > 1]


def metric_value(results: dict[str, Any] | None, name: str) -> float | None:
    """A number from ``results.json``: a top-level key or a logged metric."""
    if results is None:
        return None
    value = results.get(name, results.get("metrics", {}).get(name))
    return float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None


def table_rows(jobs: list[dict[str, Any]], params: list[str]) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        row: dict[str, Any] = {"job": job["job"]}
        row.update({param: job["overrides"].get(param) for param in params})
        row["status"] = "done" if job["results"] is not None else "no results"
        row.update({name: metric_value(job["results"], name) for name in METRICS})
        row["world_size"] = (job["results"] or {}).get("world_size")
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def draw(rows: list[dict[str, Any]], param: str, metric: str) -> Any:
    """A matplotlib figure of ``metric`` against ``param`` for the finished jobs: the swept values are the x ticks
    (on a log axis when they span a factor of 10 or more), and the y axis starts at 0 so that differences are
    drawn to scale.

    Raises:
        RuntimeError: matplotlib is not installed, or no finished job has both values.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError(
            "The plot needs matplotlib: pip install matplotlib (the table is written without it)."
        ) from err
    points = [(row[param], row[metric]) for row in rows if row[metric] is not None and row[param] is not None]
    if not points:
        raise RuntimeError(f"No finished job has both {param!r} and {metric!r}; nothing to plot.")
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
    points.sort(key=lambda p: p[0] if numeric else str(p[0]))
    ys = [p[1] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    if numeric:
        values = [float(p[0]) for p in points]
        ax.plot(values, ys, marker="o")
        if min(values) > 0 and max(values) / min(values) >= 10:
            ax.set_xscale("log")
        ticks = sorted(set(values))
        ax.set_xticks(ticks, [f"{value:g}" for value in ticks])
        ax.minorticks_off()
    else:
        ax.plot([str(p[0]) for p in points], ys, marker="o")
    ax.set_ylim(bottom=0, top=max(max(ys), 0) * 1.1 or 1)
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs {param}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot(rows: list[dict[str, Any]], param: str, metric: str, path: Path) -> None:
    """Writes :func:`draw`'s figure to ``path`` as a PNG.

    Raises:
        RuntimeError: matplotlib is not installed, or no finished job has both values.
    """
    fig = draw(rows, param, metric)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sweep_dir", type=Path, help="the multirun folder (logs/<task>/multiruns/<id>), or its parent for the newest"
    )
    parser.add_argument("--param", help="the swept parameter to plot against (default: the first swept one)")
    parser.add_argument("--metric", default="samples_per_sec", help=f"what to plot (one of {', '.join(METRICS)})")
    parser.add_argument("--out", type=Path, help="where to write sweep_report.csv/.png (default: the sweep folder)")
    args = parser.parse_args(argv)
    sweep_dir = find_sweep(args.sweep_dir)
    if sweep_dir != args.sweep_dir:
        print(f"sweep_report: reading the newest sweep, {sweep_dir}", file=sys.stderr)
    try:
        jobs = read_sweep(sweep_dir)
    except FileNotFoundError as err:
        print(f"sweep_report: {err}", file=sys.stderr)
        return 2
    params = swept_params(jobs)
    if args.param is not None and args.param not in {k for job in jobs for k in job["overrides"]}:
        print(f"sweep_report: no job overrides {args.param!r}; swept parameters: {params or 'none'}", file=sys.stderr)
        return 2
    if args.metric not in METRICS:
        print(f"sweep_report: --metric {args.metric!r} is not one of {', '.join(METRICS)}", file=sys.stderr)
        return 2
    param = args.param or (params[0] if params else None)
    rows = table_rows(jobs, params if param is None or param in params else [param, *params])
    out = args.out or sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    with (out / "sweep_report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(markdown(rows))
    print(f"\ntable: {out / 'sweep_report.csv'}")
    if param is None:
        print("sweep_report: the jobs differ in nothing, so there is no swept parameter to plot.", file=sys.stderr)
        return 0
    try:
        plot(rows, param, args.metric, out / "sweep_report.png")
    except RuntimeError as err:
        print(f"sweep_report: {err}", file=sys.stderr)
        return 1
    print(f"plot:  {out / 'sweep_report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
