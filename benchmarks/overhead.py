"""Overhead: the same model trained by a hand-written loop, by stock Lightning on CPU and by lightning_gaudi.

Variants, alternated in rotating order within each repetition (steps/s over the batches after warm-up):

- ``hand``: a plain PyTorch loop (zero_grad, forward, backward, AdamW step) on the same data loader;
- ``stock``: ``Trainer(accelerator="cpu")``, Lightning's defaults (progress bar refreshed every step);
- ``stock_again``: ``stock`` once more, an A/A control: ``stock_again / stock`` shows how far two runs of the same
  code differ on this machine (the noise floor of every ratio);
- ``stock_bar20``: the same with ``TQDMProgressBar(refresh_rate=20)``, the plugin's bar rate, so that
  ``plugin / stock_bar20`` is the plugin's own cost with the progress-bar difference taken out;
- ``plugin``: ``Trainer(accelerator="hpu")`` on the emulated HPU, with what the plugin adds by itself
  (strategy, checkpoint IO, host-sync-free logging, progress bar refreshed every 20 steps);
- ``plugin_gaudi_set``: the same plus the Gaudi default callbacks of ``conf/callbacks/default.yaml``.

Every Lightning variant logs to a CSV logger (every 50 steps, Lightning's default) and renders its progress bar
into /dev/null. Each run records steps per wall-clock second and steps per second of the process's CPU time; the
ratios (``ratios``) use CPU time, which other tenants of a shared machine disturb far less than the wall clock
(``ratios_wall`` has the wall-clock ones). On a dedicated machine with one torch thread the two agree. The target
is ``plugin / stock >= 0.99`` (median of the per-repetition ratios); ``plugin / stock_bar20``, the best-of-repetitions
ratios (``ratios_best``) and the A/A control are reported beside it.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from benchmarks.common import (
    BenchModel,
    StepTimer,
    Workload,
    emulation,
    gaudi_callbacks,
    log,
    make_loader,
    parameter_count,
    quiet,
    ratio_summary,
    summarize,
    trainer_kwargs,
)

TARGET = 0.99
VARIANTS = ("hand", "stock", "stock_again", "stock_bar20", "plugin", "plugin_gaudi_set")


def _hand(workload: Workload, steps: int, warmup: int, mode: str | None) -> tuple[float, float]:
    with emulation(mode):
        from lightning_gaudi import hpu

        backend = hpu.get_backend()
        device = backend.device()
        lazy = backend.is_lazy()
        seed_everything(0, verbose=False)
        model = BenchModel(workload).to(device)
        optimizer = model.configure_optimizers()
        start = (0.0, 0.0)
        for index, (x, y) in enumerate(make_loader(workload, steps)):
            if index == warmup:
                start = (time.perf_counter(), time.process_time())
            optimizer.zero_grad(set_to_none=True)
            loss = model.loss((x.to(device), y.to(device)))
            loss.backward()
            if lazy:
                backend.mark_step()
            optimizer.step()
            if lazy:
                backend.mark_step()
        backend.synchronize()
        return (steps - warmup) / (time.perf_counter() - start[0]), (steps - warmup) / (time.process_time() - start[1])


def _lightning(workload: Workload, steps: int, warmup: int, variant: str, mode: str | None) -> tuple[float, float]:
    stock = variant.startswith("stock")
    with tempfile.TemporaryDirectory() as tmp, emulation(None if stock else mode):
        seed_everything(0, verbose=False)
        timer = StepTimer(warmup, steps - 1)
        callbacks: list[Any] = [timer]
        if variant == "plugin_gaudi_set":
            callbacks += gaudi_callbacks()[1]
        elif variant == "stock_bar20":
            callbacks.append(TQDMProgressBar(refresh_rate=20))
        accelerator = "cpu" if stock else "hpu"
        if accelerator == "hpu":
            from lightning_gaudi import hpu

            timer.synchronize = hpu.get_backend().synchronize
        trainer = Trainer(
            **trainer_kwargs(
                steps, accelerator=accelerator, callbacks=callbacks, logger=CSVLogger(tmp, name="", version="")
            )
        )
        with quiet():
            trainer.fit(BenchModel(workload), make_loader(workload, steps))
        return timer.steps_per_second(), timer.steps_per_cpu_second()


def _plugin_share(workload: Workload, steps: int, warmup: int, mode: str | None) -> dict[str, float]:
    """One ``plugin`` fit under cProfile: the time spent in lightning_gaudi's own functions (excluding what they call).

    A deterministic figure where the machine's noise hides a few percent: how much of a fit is the plugin's code.
    """
    import cProfile
    import pstats

    import lightning_gaudi

    package = os.path.dirname(lightning_gaudi.__file__)
    profile = cProfile.Profile()
    profile.enable()
    _lightning(workload, steps, warmup, "plugin", mode)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values())
    own = sum(entry[2] for (filename, _, _), entry in stats.items() if filename.startswith(package))
    return {"fit_seconds_profiled": total, "plugin_seconds": own, "plugin_share": own / total, "steps": steps}


def run(quick: bool = False, mode: str | None = "eager") -> dict[str, Any]:
    """Runs the alternation and returns steps/s per variant and the ratios.

    Args:
        quick: a seconds-long smoke run (numbers meaningless).
        mode: ``"eager"`` (emulation) or ``None`` (a real Gaudi: the ``stock`` CPU variant is left out, since stock
            Lightning has no HPU and a CPU figure would not compare).
    """
    import lightning_gaudi  # noqa: F401 - registers "hpu"

    workload = Workload()
    steps, warmup, repetitions = (12, 4, 1) if quick else (200, 20, 7)
    variants = [v for v in VARIANTS if mode is not None or not v.startswith("stock")]
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for repetition in range(repetitions):
        order = variants[repetition % len(variants) :] + variants[: repetition % len(variants)]
        for variant in order:
            if variant == "hand":
                per_wall, per_cpu = _hand(workload, steps, warmup, mode)
            else:
                per_wall, per_cpu = _lightning(workload, steps, warmup, variant, mode)
            wall[variant].append(per_wall)
            cpu[variant].append(per_cpu)
            log(
                f"  overhead rep {repetition + 1}/{repetitions} {variant:>16}: {per_cpu:7.1f} steps/CPU-s,"
                f" {per_wall:7.1f} steps/s"
            )
    pairs = [("plugin", "hand"), ("plugin_gaudi_set", "hand")]
    if "stock" in wall:
        pairs += [
            ("plugin", "stock"),
            ("plugin", "stock_bar20"),
            ("plugin_gaudi_set", "stock"),
            ("stock", "hand"),
            ("stock_again", "stock"),
        ]
    ratios = {f"{a}/{b}": ratio_summary(cpu[a], cpu[b]) for a, b in pairs}
    ratios_wall = {f"{a}/{b}": ratio_summary(wall[a], wall[b]) for a, b in pairs}
    share = _plugin_share(workload, steps, warmup, mode)
    log(f"  overhead: lightning_gaudi's own code took {share['plugin_share']:.2%} of a profiled plugin fit")
    # best of the repetitions: the run least disturbed by other work on the machine
    ratios_best = {f"{a}/{b}": max(cpu[a]) / max(cpu[b]) for a, b in pairs}
    return {
        "workload": workload.as_dict(),
        "parameters": parameter_count(BenchModel(workload)),
        "steps": steps,
        "warmup_steps": warmup,
        "repetitions": repetitions,
        "torch_threads": torch.get_num_threads(),
        "gaudi_set": gaudi_callbacks()[0],
        "steps_per_cpu_s": {v: summarize(values) for v, values in cpu.items()},
        "steps_per_s": {v: summarize(values) for v, values in wall.items()},
        "ratios": ratios,
        "ratios_wall": ratios_wall,
        "ratios_best": ratios_best,
        "plugin_code": share,
        "target": {"plugin/stock": TARGET},
        "met": None if "stock" not in wall else ratios["plugin/stock"]["median"] >= TARGET,
    }
