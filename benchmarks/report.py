"""The results table (Markdown) and figure (PNG) from a results dictionary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MB = 1024 * 1024


def _spread(summary: dict[str, Any], fmt: str = ".3f") -> str:
    return f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}})"


#: What the "met" column says under ``--quick``: a smoke run's numbers mean nothing, so no target is judged.
NOT_JUDGED = "not judged (--quick)"


def table(results: dict[str, Any]) -> str:
    """A Markdown table of every figure, medians with (min-max) over repetitions, and the machine line.

    Under ``--quick`` the targets are listed but not judged.
    """
    m = results["machine"]
    s = results["sections"]

    def _met(flag: bool | None) -> str:
        if results["quick"]:
            return NOT_JUDGED
        return "n/a" if flag is None else ("yes" if flag else "**no**")

    rows: list[tuple[str, str, str, str]] = []
    if "overhead" in s:
        o = s["overhead"]
        for name in o["steps_per_s"]:
            rows.append(
                (
                    f"overhead: {name}, steps per CPU-second / per wall-second",
                    f"{_spread(o['steps_per_cpu_s'][name], '.1f')} / {_spread(o['steps_per_s'][name], '.1f')}",
                    "",
                    "",
                )
            )
        ratios, ratios_wall = o["ratios"], o["ratios_wall"]
        labels = {
            "plugin/stock": "plugin / stock Lightning",
            "plugin/stock_bar20": "plugin / stock Lightning with the plugin's bar rate (20)",
            "plugin_gaudi_set/stock": "plugin + Gaudi set / stock Lightning",
            "stock/hand": "stock Lightning / hand loop",
            "plugin/hand": "plugin / hand loop",
            "plugin_gaudi_set/hand": "plugin + Gaudi set / hand loop",
            "stock_again/stock": "A/A control: stock Lightning / stock Lightning",
        }
        share = o["plugin_code"]
        rows.append(
            (
                "overhead: time in lightning_gaudi's own code, share of a profiled plugin fit",
                f"{share['plugin_share']:.2%}"
                f" ({share['plugin_seconds'] * 1e6 / share['steps']:.0f} us per step, set-up included)",
                "",
                "",
            )
        )
        for key, label in labels.items():
            if key not in ratios:
                continue
            target, met = (">= 0.99 (CPU-time median)", _met(o["met"])) if key == "plugin/stock" else ("", "")
            rows.append(
                (
                    f"overhead: {label}, CPU time / wall clock / best of runs (CPU)",
                    f"{_spread(ratios[key])} / {_spread(ratios_wall[key])} / {o['ratios_best'][key]:.3f}",
                    target,
                    met,
                )
            )
    if "lazy" in s:
        lz = s["lazy"]

        def num(value: Any, fmt: str) -> str:
            return "not counted" if value is None else f"{value:{fmt}}"

        for name, v in lz["variants"].items():
            target = "0 / <= 0.05" if name == "plugin" else ""
            met = _met(lz["met"]) if name == "plugin" else ""
            rows.append(
                (
                    f"lazy {name}: graph compilations after warm-up / host syncs per step",
                    f"{v['compilations_after_warmup']} / {num(v['host_syncs_per_step'], '.3f')}",
                    target,
                    met,
                )
            )
            rows.append(
                (
                    f"lazy {name}: mark_steps per step; steps per CPU-second / per wall-second",
                    f"{num(v['mark_steps_per_step'], '.2f')}; {_spread(v['steps_per_cpu_s'], '.1f')} /"
                    f" {_spread(v['steps_per_s'], '.1f')}",
                    "",
                    "",
                )
            )
        rows.append(
            (
                "lazy: plugin / stock speed, CPU time / wall clock",
                f"{_spread(lz['ratios']['plugin/stock'])} / {_spread(lz['ratios_wall']['plugin/stock'])}",
                "",
                "",
            )
        )
        rows.append(
            (
                "lazy: plugin + Gaudi set / stock speed, CPU time / wall clock",
                f"{_spread(lz['ratios']['plugin_gaudi_set/stock'])} /"
                f" {_spread(lz['ratios_wall']['plugin_gaudi_set/stock'])}",
                "",
                "",
            )
        )
    if "ddp" in s:
        d = s["ddp"]
        b = d["bucket_cap"]
        for run in b["runs"]:
            cap = "default (25, first 1 MiB)" if run["bucket_cap_mb"] is None else run["bucket_cap_mb"]
            rows.append(
                (
                    f"ddp: all-reduces/step, bucket_cap_mb={cap} ({b['gradient_bytes'] / _MB:.2f} MiB of gradients)",
                    f"{run['allreduce_calls_per_step']:g}",
                    f"expected {run['expected']}",
                    _met(run["allreduce_calls_per_step"] == run["expected"]),
                )
            )
        g = d["gradient_as_bucket_view"]
        settings = g["settings"]
        saving = g["saving_fraction_of_one_gradient_copy"]
        rows.append(
            (
                f"ddp: memory in use after backward, view on / off ({g['parameters'] / 1e6:.1f}M params,"
                f" {g['gradient_bytes'] / _MB:.0f} MiB of gradients)",
                f"{settings['view_on']['in_use_after_backward_bytes'] / _MB:.0f} /"
                f" {settings['view_off']['in_use_after_backward_bytes'] / _MB:.0f} MiB",
                "",
                "",
            )
        )
        rows.append(
            (
                "ddp: gradient_as_bucket_view saving, fraction of one gradient copy (in use after backward)",
                f"{saving['in_use_after_backward_bytes']:.3f}",
                ">= 0.9",
                _met(g["met"]),
            )
        )
        rows.append(
            (
                "ddp: same, on the process peak RSS",
                f"{saving['process_peak_rss_bytes']:.3f}",
                "",
                "",
            )
        )
        st = d["static_graph"]
        rows.append(("ddp: steps/s static_graph off", _spread(st["steps_per_s_off"], ".1f"), "", ""))
        rows.append(("ddp: steps/s static_graph on", _spread(st["steps_per_s_on"], ".1f"), "", ""))
        rows.append(("ddp: static_graph on / off", _spread(st["on/off"]), "", ""))
    if "fused" in s:
        f = s["fused"]
        for name, summary in f["ms_per_step"].items():
            rows.append(
                (f"optimizer step ms, {name} ({f['parameters'] / 1e6:.1f}M params)", _spread(summary, ".2f"), "", "")
            )
        rows.append(
            ("optimizer step: unfused / fused time (speed-up)", _spread(f["speedup_unfused/fused"], ".2f"), "", "")
        )
    if "scaling" in s:
        sc = s["scaling"]
        for procs, summary in sc["samples_per_s"].items():
            rows.append((f"scaling: samples/s, {procs} process(es)", _spread(summary, ".1f"), "", ""))
        rows.append(("scaling: speed-up 2 vs 1 / efficiency", f"{sc['speedup']:.2f} / {sc['efficiency']:.2f}", "", ""))
        for procs, summary in sc["cpu_utilization"].items():
            rows.append(
                (f"scaling: CPU time / wall time per process, {procs} process(es)", _spread(summary, ".2f"), "", "")
            )
    if "threads" in s:
        th = s["threads"]
        for count, row in th["per_threads"].items():
            rows.append(
                (
                    f"threads: the example GPT in eager emulation, {count} torch thread(s): steps/s; steps per"
                    " CPU-second; cores busy; load average at start",
                    f"{_spread(row['steps_per_s'], '.2f')}; {_spread(row['steps_per_cpu_s'], '.2f')};"
                    f" {row['cpu_utilization']['median']:.2f}; {row['load_before']['median']:.1f}",
                    "",
                    "",
                )
            )
        for count, speed in th["speed_vs_one_thread"].items():
            rows.append((f"threads: speed with {count} thread(s) / with 1", f"{speed:.2f}", "", ""))
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
        lines.append("")
        lines.append("A quick run is a smoke test: its numbers mean nothing, so no target is judged.")
    return "\n".join(lines)


def draw(results: dict[str, Any]) -> Any:
    """A matplotlib figure of the main figures; every bar is labelled with its value (some are too small to see).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["sections"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    m = results["machine"]
    run = "quick run: the numbers mean nothing" if results["quick"] else "full run"
    fig.suptitle(
        f"lightning_gaudi benchmarks, {results['mode']}; {m['cores']} cores, torch {m['torch']},"
        f" Lightning {m['lightning']}; {run}"
    )

    def headroom(ax: Any, factor: float = 1.3) -> None:
        """Room above the tallest bar for the value labels and the legend."""
        ax.set_ylim(0, ax.get_ylim()[1] * factor)

    def bars(ax: Any, summaries: dict[str, dict[str, Any]], title: str, ylabel: str, fmt: str) -> None:
        names = list(summaries)
        medians = [summaries[n]["median"] for n in names]
        low = [summaries[n]["median"] - summaries[n]["min"] for n in names]
        high = [summaries[n]["max"] - summaries[n]["median"] for n in names]
        drawn = ax.bar(names, medians, yerr=[low, high], capsize=4, color="tab:blue")
        ax.bar_label(drawn, fmt=fmt, label_type="center", color="white", fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", labelrotation=20)

    if "overhead" in s:
        bars(
            axes[0][0],
            s["overhead"]["steps_per_cpu_s"],
            "Overhead (eager): steps per CPU-second",
            "steps/CPU-s",
            "%.1f",
        )
    if "lazy" in s:
        v = s["lazy"]["variants"]
        ax = axes[0][1]
        drawn = ax.bar(list(v), [v[n]["host_syncs_per_step"] or 0.0 for n in v], color="tab:orange")
        ax.bar_label(drawn, fmt="%.2f", padding=2)
        ax.axhline(0.05, color="k", linestyle="--", label="target 0.05")
        ax.set_title("Lazy: host syncs per step")
        headroom(ax)
        ax.legend(loc="upper right")
    if "ddp" in s:
        runs = s["ddp"]["bucket_cap"]["runs"]
        ax = axes[0][2]
        labels = ["default" if r["bucket_cap_mb"] is None else f"{r['bucket_cap_mb']:g}" for r in runs]
        x = range(len(runs))
        measured = ax.bar(
            [i - 0.2 for i in x], [r["allreduce_calls_per_step"] for r in runs], width=0.4, label="measured"
        )
        expected = ax.bar([i + 0.2 for i in x], [r["expected"] for r in runs], width=0.4, label="expected")
        for drawn in (measured, expected):
            ax.bar_label(drawn, fmt="%g", padding=2, fontsize=8)
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("bucket_cap_mb")
        ax.set_title("DDP: all-reduce calls per step")
        headroom(ax)
        ax.legend(loc="upper right", ncols=2)
        g = s["ddp"]["gradient_as_bucket_view"]["settings"]
        ax = axes[1][0]
        names = [n.replace("_", "\n", 2) for n in g]
        for key, label, width in (
            ("in_use_after_backward_bytes", "in use after backward", 0.4),
            ("process_peak_rss_bytes", "process peak RSS", -0.4),
        ):
            drawn = ax.bar(names, [g[n][key] / _MB for n in g], width=width, label=label, align="edge")
            ax.bar_label(drawn, fmt="%.0f", padding=2, fontsize=8)
        ax.set_ylabel("MiB per rank")
        ax.set_title(
            f"DDP: gradient_as_bucket_view ({s['ddp']['gradient_as_bucket_view']['parameters'] / 1e6:.1f}M params)"
        )
        headroom(ax)
        ax.legend(loc="upper left", ncols=2, fontsize=8)
    if "fused" in s:
        bars(axes[1][1], s["fused"]["ms_per_step"], "AdamW step time", "ms/step", "%.2f")
    if "scaling" in s:
        bars(axes[1][2], s["scaling"]["samples_per_s"], "Scaling: samples/s by processes", "samples/s", "%.0f")
    fig.tight_layout()
    return fig


def figure(results: dict[str, Any], path: Path) -> bool:
    """Writes :func:`draw`'s PNG to ``path``. Returns False (and writes nothing) without matplotlib."""
    try:
        fig = draw(results)
    except ImportError:
        return False
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
