"""Scaling: samples/s with 1 process (``hpu_single``) and 2 processes (``hpu_parallel``, default knobs).

The 2-process figures are the ``static_graph=False`` fits of :mod:`benchmarks.ddp_knobs` (the strategy's defaults);
the 1-process fits run the same worker code with the same model, per-process batch and step count, here. Every
process uses one torch thread: one emulated card per core. Efficiency = samples/s(2) / (2 x samples/s(1)).

Beside it, each process's CPU utilization (CPU time over wall time in the timed window): with one thread, 1.0 means
a core to itself; less means it waited, for its peer's all-reduce or for a core the machine's other work held.
"""

from __future__ import annotations

from typing import Any

from benchmarks import ddp_knobs
from benchmarks.common import emulation, log, summarize


def run(ddp_result: dict[str, Any], quick: bool = False, mode: str | None = "eager") -> dict[str, Any]:
    """Measures 1 process and combines it with the 2-process figures from ``ddp_result``."""
    from benchmarks.ddp_worker import _trial

    static = ddp_result["static_graph"]
    steps, warmup, repetitions = static["steps"], static["warmup_steps"], static["repetitions"]
    one: list[float] = []
    utilization: list[float] = []
    with emulation(mode):
        for repetition in range(repetitions):
            result = _trial(ddp_knobs._trial("single", steps, warmup), devices=1)
            one.append(result["samples_per_s"])
            utilization.append(result["cpu_utilization"])
            log(f"  scaling rep {repetition + 1}/{repetitions} 1 process: {one[-1]:7.1f} samples/s")
    two = static["samples_per_s_off"]
    single, double = summarize(one), summarize(two)
    return {
        "workload": ddp_knobs.WORKLOAD,
        "per_process_batch": ddp_knobs.WORKLOAD["batch"],
        "steps": steps,
        "warmup_steps": warmup,
        "threads_per_process": 1,
        "samples_per_s": {"1": single, "2": double},
        "speedup": double["median"] / single["median"],
        "efficiency": double["median"] / (2 * single["median"]),
        # how much of a core each process got (CPU time / wall time): below 1, it waited (peers, other tenants)
        "cpu_utilization": {"1": summarize(utilization), "2": summarize(static["cpu_utilization_off"])},
    }
