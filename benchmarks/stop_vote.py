"""The preemption vote's cost per training step, 2 processes on loopback: ``StopVote.step`` alone in a loop.

``python -m benchmarks.stop_vote [--steps N] [--step-ms MS] [--rounds N] [--out FILE]``. Each round starts a fresh
pair of processes (a gloo process group on a ``TCPStore``, as the HPU strategies form in emulation), sets the vote up
as ``PreemptionCheckpoint(grace_period=25)`` does and calls ``step(0)`` ``steps`` times, with ``step-ms`` of sleep
between calls standing in for the step's own work. It reports, per rank, the main thread's wall time inside
``step`` (what the training loop waits for) and the process's CPU time over the loop beyond the sleep (the vote's
threads included), both per step in microseconds. Run it against another checkout with ``PYTHONPATH`` to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker(rank: int, port: int, steps: int, step_s: float, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    from lightning_gaudi.distributed.agreement import StopVote

    vote = StopVote(timedelta(seconds=60), latency=25.0 / 4)
    vote.setup()
    inside = 0.0
    cpu = _cpu()
    for _ in range(steps):
        if step_s:
            time.sleep(step_s)
        start = time.perf_counter()
        vote.step(0)
        inside += time.perf_counter() - start
    cpu = _cpu() - cpu
    vote.finish()
    dist.barrier()
    results.put((rank, inside / steps * 1e6, cpu / steps * 1e6))
    dist.destroy_process_group()


def run(steps: int, step_ms: float, rounds: int) -> dict[str, Any]:
    from lightning_gaudi.distributed.launcher import free_port

    inside: list[float] = []
    cpu: list[float] = []
    context = mp.get_context("spawn")
    for _ in range(rounds):
        results, port = context.SimpleQueue(), free_port()
        procs = [
            context.Process(target=_worker, args=(rank, port, steps, step_ms / 1000, results)) for rank in range(2)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(600)
        for _rank in range(2):
            _, wall_us, cpu_us = results.get()
            inside.append(wall_us)
            cpu.append(cpu_us)
    cpu_name = platform.processor() or platform.machine()
    return {
        "steps": steps,
        "step_ms": step_ms,
        "rounds": rounds,
        "torch": torch.__version__,
        "machine": f"{cpu_name}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "step_wall_us": {"median": statistics.median(inside), "min": min(inside), "max": max(inside)},
        "cpu_beyond_sleep_us": {"median": statistics.median(cpu), "min": min(cpu), "max": max(cpu)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = run(args.steps, args.step_ms, args.rounds)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
