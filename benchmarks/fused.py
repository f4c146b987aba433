"""Fused against unfused optimizer: the time of ``optimizer.step()`` alone, for the same parameters and gradients.

``fused``: the seam's ``fused_adamw`` (``hpex.optimizers.FusedAdamW`` on Gaudi, torch's ``AdamW(fused=True)`` in eager
emulation), what :class:`~lightning_gaudi.callbacks.FusedOptimizers` installs. ``unfused``: ``torch.optim.AdamW`` with
torch's defaults (on CPU tensors, its single-tensor loop). Alternated in rotating order, several repetitions.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.common import BenchModel, Workload, emulation, log, ratio_summary, summarize

WORKLOAD = Workload(d_model=256, heads=4, blocks=4, seq=32, batch=16)


def _time_steps(optimizer: torch.optim.Optimizer, steps: int, warmup: int, backend: Any) -> float:
    for index in range(warmup + steps):
        if index == warmup:
            backend.synchronize()
            start = time.perf_counter()
        optimizer.step()
        backend.mark_step()
    backend.synchronize()
    return (time.perf_counter() - start) / steps


def run(quick: bool = False, mode: str | None = "eager") -> dict[str, Any]:
    """Returns ms per optimizer step for each variant and the unfused/fused time ratio (the speed-up)."""
    steps, warmup, repetitions = (3, 1, 1) if quick else (40, 5, 5)
    with emulation(mode):
        from lightning_gaudi import hpu

        backend = hpu.get_backend()
        torch.manual_seed(0)
        model = BenchModel(WORKLOAD).to(backend.device())
        params = [p for p in model.parameters()]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        backend.mark_step()
        factories = {
            "unfused": lambda: torch.optim.AdamW(params, lr=1e-4),
            "fused": lambda: backend.fused_adamw(params, lr=1e-4, eps=1e-8),
        }
        measured: dict[str, list[float]] = {name: [] for name in factories}
        names = list(factories)
        for repetition in range(repetitions):
            for name in names[repetition % 2 :] + names[: repetition % 2]:
                seconds = _time_steps(factories[name](), steps, warmup, backend)
                measured[name].append(seconds * 1e3)
                log(f"  fused rep {repetition + 1}/{repetitions} {name:>8}: {seconds * 1e3:7.2f} ms/step")
        fused_class = type(factories["fused"]()).__module__ + "." + type(factories["fused"]()).__qualname__
    return {
        "workload": WORKLOAD.as_dict(),
        "parameters": sum(p.numel() for p in params),
        "steps": steps,
        "warmup_steps": warmup,
        "repetitions": repetitions,
        "fused_optimizer": fused_class,
        "ms_per_step": {name: summarize(values) for name, values in measured.items()},
        "speedup_unfused/fused": ratio_summary(measured["unfused"], measured["fused"]),
    }
