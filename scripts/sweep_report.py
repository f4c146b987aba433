#!/usr/bin/env python3
"""Gathers a Hydra sweep's results into a table (Markdown on stdout, CSV) and a PNG plot, for grid sweeps and
Optuna searches alike.

    python scripts/sweep_report.py logs/bucket_sweep/multiruns/<id>
    python scripts/sweep_report.py logs/bucket_sweep/multiruns          # the newest sweep there
    python scripts/sweep_report.py logs/gpt_optuna/multiruns            # an Optuna search: also its best trial
    python scripts/sweep_report.py SWEEP_DIR --param strategy.bucket_cap_mb --metric tokens_per_sec

Each job folder of the sweep holds ``.hydra/overrides.yaml`` (what the job was given) and, when it finished,
``results.json`` (written by ``examples/train.py``). The swept parameters are the overrides whose values differ
between jobs. Writes ``sweep_report.csv`` and ``sweep_report.png`` into the sweep folder (or ``--out``).
Needs matplotlib for the plot (``pip install matplotlib``).

An Optuna search (``hparams_search=gpt_optuna``) leaves ``optimization_results.yaml`` in its folder when it ends:
the report then names the best trial (its job, parameters and value; ``best`` column), and plots the search's
objective (the jobs' ``optimized_metric``) against its first parameter, one point per trial.
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
#: What Hydra's Optuna sweeper writes into the sweep folder when the search ends.
OPTUNA_RESULTS = "optimization_results.yaml"


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
    """``path`` itself, or the newest sweep in it when it is a folder of sweeps (``logs/<task>/multiruns``): a folder
    with Hydra's ``multirun.yaml`` or with job folders (Optuna's sweeper writes no ``multirun.yaml``)."""
    if path.is_dir() and not any(path.glob("*/.hydra/overrides.yaml")):
        found = {p.parent for p in path.glob("*/multirun.yaml")}
        found |= {p.parents[2] for p in path.glob("*/*/.hydra/overrides.yaml")}
        sweeps = sorted(found, key=lambda p: p.stat().st_mtime)
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


def read_optuna(sweep_dir: Path, jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """An Optuna search's outcome: ``best_params``, ``best_value``, ``best_job`` (the job folder whose overrides are
    the best parameters; ``None`` when the best trial ran elsewhere, e.g. in an earlier run of a stored study) and
    ``metric`` (the jobs' ``optimized_metric``). ``None`` for a sweep without ``optimization_results.yaml``."""
    path = sweep_dir / OPTUNA_RESULTS
    if not path.is_file():
        return None
    outcome = yaml.safe_load(path.read_text()) or {}
    best = outcome.get("best_params")
    if not isinstance(best, dict):  # a multi-objective search lists its Pareto front instead
        return None
    best_job = next(
        (job["job"] for job in jobs if all(_same(job["overrides"].get(k), v) for k, v in best.items())), None
    )
    return {
        "best_params": best,
        "best_value": outcome.get("best_value"),
        "best_job": best_job,
        "metric": optimized_metric(sweep_dir, jobs),
    }


def _same(given: Any, best: Any) -> bool:
    if isinstance(given, (int, float)) and isinstance(best, (int, float)) and not isinstance(given, bool):
        return math.isclose(float(given), float(best), rel_tol=1e-9)
    return given == best or str(given) == str(best)


def optimized_metric(sweep_dir: Path, jobs: list[dict[str, Any]]) -> str | None:
    """The ``optimized_metric`` of the sweep's jobs (from the first job's ``.hydra/config.yaml``)."""
    for job in jobs:
        config = sweep_dir / job["job"] / ".hydra" / "config.yaml"
        if config.is_file():
            value = (yaml.safe_load(config.read_text()) or {}).get("optimized_metric")
            return str(value) if value else None
    return None


def is_optuna_search(sweep_dir: Path, jobs: list[dict[str, Any]]) -> bool:
    """Whether Hydra's Optuna sweeper ran the sweep (its results file, or the sweeper named in a job's hydra.yaml)."""
    if (sweep_dir / OPTUNA_RESULTS).is_file():
        return True
    for job in jobs:
        hydra_file = sweep_dir / job["job"] / ".hydra" / "hydra.yaml"
        if hydra_file.is_file():
            sweeper = ((yaml.safe_load(hydra_file.read_text()) or {}).get("hydra") or {}).get("sweeper") or {}
            return "optuna" in str(sweeper.get("_target_", ""))
    return False


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


def table_rows(
    jobs: list[dict[str, Any]], params: list[str], metrics: tuple[str, ...] = METRICS, best_job: str | None = None
) -> list[dict[str, Any]]:
    """One row per job: its values of ``params``, status, ``metrics`` and world size (and a ``best`` mark on
    ``best_job`` when given)."""
    rows = []
    for job in jobs:
        row: dict[str, Any] = {"job": job["job"]}
        row.update({param: job["overrides"].get(param) for param in params})
        row["status"] = "done" if job["results"] is not None else "no results"
        row.update({name: metric_value(job["results"], name) for name in metrics})
        row["world_size"] = (job["results"] or {}).get("world_size")
        if best_job is not None:
            row["best"] = "*" if job["job"] == best_job else ""
        rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def draw(rows: list[dict[str, Any]], param: str, metric: str, scatter: bool = False) -> Any:
    """A matplotlib figure of ``metric`` against ``param`` for the finished jobs: the swept values are the x ticks
    (on a log axis when they span a factor of 10 or more), and the y axis starts at 0 so that differences are
    drawn to scale. ``scatter`` draws unconnected points on matplotlib's own ticks, for a search whose trials also
    differ in other parameters and whose values are not a grid.

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
    linestyle = "none" if scatter else "-"
    if numeric:
        values = [float(p[0]) for p in points]
        ax.plot(values, ys, marker="o", linestyle=linestyle)
        if min(values) > 0 and max(values) / min(values) >= 10:
            ax.set_xscale("log")
        if not scatter:
            ticks = sorted(set(values))
            ax.set_xticks(ticks, [f"{value:g}" for value in ticks])
            ax.minorticks_off()
    else:
        ax.plot([str(p[0]) for p in points], ys, marker="o", linestyle=linestyle)
    ax.set_ylim(bottom=0, top=max(max(ys), 0) * 1.1 or 1)
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs {param}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot(rows: list[dict[str, Any]], param: str, metric: str, path: Path, scatter: bool = False) -> None:
    """Writes :func:`draw`'s figure to ``path`` as a PNG.

    Raises:
        RuntimeError: matplotlib is not installed, or no finished job has both values.
    """
    fig = draw(rows, param, metric, scatter=scatter)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sweep_dir", type=Path, help="the multirun folder (logs/<task>/multiruns/<id>), or its parent for the newest"
    )
    parser.add_argument("--param", help="the swept parameter to plot against (default: the first swept one)")
    parser.add_argument(
        "--metric",
        help=f"what to plot (one of {', '.join(METRICS)}; default samples_per_sec, or an Optuna search's objective)",
    )
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
    optuna = is_optuna_search(sweep_dir, jobs)
    outcome = read_optuna(sweep_dir, jobs)
    objective = outcome["metric"] if outcome else optimized_metric(sweep_dir, jobs) if optuna else None
    metrics = METRICS if objective is None or objective in METRICS else (*METRICS, objective)
    params = swept_params(jobs)
    if outcome:  # the search's parameters, even where every trial drew the same value
        params = [*outcome["best_params"], *(p for p in params if p not in outcome["best_params"])]
    if args.param is not None and args.param not in {k for job in jobs for k in job["overrides"]}:
        print(f"sweep_report: no job overrides {args.param!r}; swept parameters: {params or 'none'}", file=sys.stderr)
        return 2
    metric = args.metric or (objective if optuna and objective else "samples_per_sec")
    if metric not in metrics:
        print(f"sweep_report: --metric {metric!r} is not one of {', '.join(metrics)}", file=sys.stderr)
        return 2
    param = args.param or (params[0] if params else None)
    columns = params if param is None or param in params else [param, *params]
    rows = table_rows(jobs, columns, metrics, best_job=outcome["best_job"] if outcome else None)
    out = args.out or sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    with (out / "sweep_report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(markdown(rows))
    if outcome:
        print("\n" + best_line(outcome))
    elif optuna:
        print(f"\nsweep_report: no {OPTUNA_RESULTS} yet: the search has not finished (or it failed).")
    print(f"\ntable: {out / 'sweep_report.csv'}")
    if param is None:
        print("sweep_report: the jobs differ in nothing, so there is no swept parameter to plot.", file=sys.stderr)
        return 0
    try:
        plot(rows, param, metric, out / "sweep_report.png", scatter=optuna)
    except RuntimeError as err:
        print(f"sweep_report: {err}", file=sys.stderr)
        return 1
    print(f"plot:  {out / 'sweep_report.png'}")
    return 0


def best_line(outcome: dict[str, Any]) -> str:
    """The best trial of an Optuna search, in one line."""
    where = f"job {outcome['best_job']}" if outcome["best_job"] is not None else "a trial not in this folder"
    params = ", ".join(f"{key}={_cell(value)}" for key, value in outcome["best_params"].items())
    value = outcome["best_value"]
    shown = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
    return f"best trial ({OPTUNA_RESULTS}): {where}: {params} -> {outcome['metric'] or 'objective'} {shown}"


if __name__ == "__main__":
    sys.exit(main())
