"""DDP knobs of ``hpu_parallel`` in 2 processes (eager emulation, gloo), each launch a real popen DDP run.

- ``bucket_cap_mb``: all-reduce calls per step, counted by a DDP comm hook (passed as the strategy's
  ``ddp_comm_hook``), against the count expected from the gradient sizes: DDP packs gradients in the order they
  become ready (about the reverse of registration) into a bucket until it holds at least ``bucket_cap_mb``; the first
  bucket is capped at 1 MiB when ``bucket_cap_mb`` is left to torch's default (25 MB).
- ``gradient_as_bucket_view``: memory of each rank training a 100.7M-parameter MLP with plain SGD, on and off, each in
  fresh processes; see :data:`METHOD`.
  The saving (off - on) is compared with the size of one gradient copy.
- ``static_graph``: steps/s with it off and on, alternated in the same launch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import EMULATE_ENV, log, ratio_summary, summarize

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = {"d_model": 128, "heads": 4, "blocks": 2, "seq": 32, "batch": 16}
WIDE = {"width": 2048, "layers": 24}
#: ``None`` is torch's default: 25 MB buckets after a first bucket of 1 MiB.
CAPS: tuple[float | None, ...] = (0.25, 0.5, 1.0, 2.0, None)
DEFAULT_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1024 * 1024
MEMORY_TARGET = 0.9
MEMORY_STEPS = 4
#: (name, gradient_as_bucket_view)
MEMORY_SETTINGS: tuple[tuple[str, bool], ...] = (("view_on", True), ("view_off", False))
#: A fixed mmap threshold: every buffer above 1 MiB is its own mapping, counted while held and returned when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)}
METHOD = (
    "Each setting in a fresh pair of processes with glibc's mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_),"
    " so every tensor above 1 MiB is its own mapping. in_use: glibc's own count of bytes handed out (mallinfo2:"
    " uordblks + hblkhd) at the end of backward (gradients and buckets all alive: the step's high point), max over"
    " steps after DDP's first-step bucket rebuild and over ranks. process_peak_rss: the kernel's high-water mark"
    " (getrusage ru_maxrss) over the whole process."
)


def expected_buckets(gradient_sizes: list[int], bucket_cap_mb: float | None) -> int:
    """How many buckets (all-reduce calls) DDP makes of gradients of these sizes (bytes, registration order)."""
    cap = int((DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 1024 * 1024)
    limits = [FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap, cap]
    buckets, filled = 0, 0
    for size in reversed(gradient_sizes):
        filled += size
        if filled >= limits[min(buckets, 1)]:
            buckets, filled = buckets + 1, 0
    return buckets + (filled > 0)


def launch(
    spec: dict[str, Any], mode: str | None, timeout: float = 400, env_extra: dict[str, str] | None = None
) -> list[list[dict[str, Any]]]:
    """Runs :mod:`benchmarks.ddp_worker` with ``spec``; returns each rank's list of trial results."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_GAUDI_")}
    env.update(env_extra or {})
    if mode is not None:
        env[EMULATE_ENV] = mode
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, "-m", "benchmarks.ddp_worker", str(spec_path), tmp]
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(spec["devices"])]


def _trial(name: str, steps: int, warmup: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "workload": WORKLOAD, "batch": WORKLOAD["batch"], "steps": steps, "warmup": warmup, **extra}


def run(quick: bool = False, mode: str | None = "eager") -> dict[str, Any]:
    """Launches the 2-process runs and returns the three measurements."""
    steps, warmup, repetitions = (6, 3, 1) if quick else (80, 10, 3)
    wide = {"width": 256, "layers": 4} if quick else WIDE

    trials = [_trial(f"cap={cap}", 6 if quick else 10, 3, knobs={"bucket_cap_mb": cap}) for cap in CAPS]
    for repetition in range(repetitions):
        order = (False, True) if repetition % 2 == 0 else (True, False)
        trials += [_trial(f"static={s}", steps, warmup, knobs={"static_graph": s}) for s in order]
    memory_trials = [
        {
            "name": setting,
            "wide": wide,
            "batch": 8,
            "steps": MEMORY_STEPS,
            "warmup": 1,
            "knobs": {"gradient_as_bucket_view": view},
        }
        for setting, view in MEMORY_SETTINGS
    ]
    if quick:  # one launch for everything: the memory figures are meaningless, the plumbing is exercised
        ranks = launch({"devices": 2, "trials": trials + memory_trials}, mode, env_extra=MALLOC_ENV)
        memory_results = {t["name"]: [rank[len(trials) + i] for rank in ranks] for i, t in enumerate(memory_trials)}
        ranks = [rank[: len(trials)] for rank in ranks]
    else:
        log(f"  ddp: launching 2 processes for {len(trials)} fits (bucket caps, static_graph)")
        ranks = launch({"devices": 2, "trials": trials}, mode)
        memory_results = {}
        for trial in memory_trials:  # fresh processes per setting: the kernel's high-water mark only goes up
            log(f"  ddp: launching 2 processes, {wide} MLP, {trial['name']}")
            launched = launch({"devices": 2, "trials": [trial]}, mode, env_extra=MALLOC_ENV)
            memory_results[trial["name"]] = [rank[0] for rank in launched]
    rank0 = ranks[0]

    buckets = []
    for cap, result in zip(CAPS, rank0[: len(CAPS)], strict=True):
        sizes = result["gradient_sizes_bytes"]
        buckets.append(
            {
                "bucket_cap_mb": cap,
                "allreduce_calls_per_step": result["allreduce_calls_per_step"],
                "expected": expected_buckets(sizes, cap),
                "naive_ceil": math.ceil(sum(sizes) / ((DEFAULT_CAP_MB if cap is None else cap) * 1024 * 1024)),
                "bucket_layout_bytes": result["bucket_layout_bytes"],
                "ddp": result["ddp"],
            }
        )
        log(
            f"  ddp: bucket_cap_mb={cap}: {result['allreduce_calls_per_step']} all-reduces/step"
            f" (expected {buckets[-1]['expected']})"
        )
    static = {
        flag: [r["steps_per_s"] for r in rank0[len(CAPS) :] if r["knobs"]["static_graph"] is flag]
        for flag in (False, True)
    }

    # emulation: glibc's count of host memory; a Gaudi: the card's InUse (HBM)
    in_use_key = "malloc_in_use_after_backward_bytes" if mode else "device_in_use_after_backward_bytes"
    memory: dict[str, Any] = {}
    for setting, view in MEMORY_SETTINGS:
        results = memory_results[setting]
        memory[setting] = {
            "gradient_as_bucket_view": view,
            # HPUParallelStrategy releases the first step's gradients when they are bucket views (see its docstring)
            "grads_freed_after_optimizer_step": "once, after the first step (the strategy)" if view else "never",
            # the step's high point, after DDP rebuilt its buckets at the first step: max over steps >= 2
            "in_use_after_backward_bytes": max(max(r[in_use_key][1:]) for r in results),
            "rss_after_backward_bytes": max(max(r["rss_after_backward_bytes"][1:]) for r in results),
            "process_peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
            "rss_before_fit_bytes": max(r["rss_before_fit_bytes"] for r in results),
        }
        parameters, gradient_bytes = results[0]["parameters"], results[0]["gradient_bytes"]
    on, off = (memory[name] for name, _ in MEMORY_SETTINGS)
    saving = {
        key: (off[key] - on[key]) / gradient_bytes
        for key in ("in_use_after_backward_bytes", "rss_after_backward_bytes", "process_peak_rss_bytes")
    }
    return {
        "workload": WORKLOAD,
        "comm_hook_registered_by": rank0[0]["comm_hook_registered_by"],
        "bucket_cap": {
            "parameters": rank0[0]["parameters"],
            "gradient_bytes": rank0[0]["gradient_bytes"],
            "runs": buckets,
            "matches_expected": all(b["allreduce_calls_per_step"] == b["expected"] for b in buckets),
        },
        "gradient_as_bucket_view": {
            "model": wide,
            "parameters": parameters,
            "gradient_bytes": gradient_bytes,
            "method": METHOD if mode else "in_use: the card's memory_stats()['InUse'] at the end of backward",
            "settings": memory,
            "saving_fraction_of_one_gradient_copy": saving,
            "target": MEMORY_TARGET,
            "met": saving["in_use_after_backward_bytes"] >= MEMORY_TARGET,
        },
        "static_graph": {
            "steps": steps,
            "warmup_steps": warmup,
            "repetitions": repetitions,
            "steps_per_s_off": summarize(static[False]),
            "steps_per_s_on": summarize(static[True]),
            "on/off": ratio_summary(static[True], static[False]),
            # the default knobs (static_graph off): the 2-process figure of benchmarks.scaling
            "samples_per_s_off": [r["samples_per_s"] for r in rank0[len(CAPS) :] if not r["knobs"]["static_graph"]],
            # CPU time / wall time of each rank in those fits (1.0: a core all to itself, never waiting)
            "cpu_utilization_off": [
                r["cpu_utilization"] for rank in ranks for r in rank[len(CAPS) :] if not r["knobs"]["static_graph"]
            ],
        },
    }
