"""Overhead: the same model trained by a hand-written loop, by stock Lightning on CPU and by lightning_gaudi.

Variants, alternated in rotating order within each repetition (steps/s over the batches after warm-up):

- ``hand``: a plain PyTorch loop (zero_grad, forward, backward, AdamW step) on the same data loader;
- ``stock``: ``Trainer(accelerator="cpu")``, Lightning's defaults (progress bar refreshed every step);
- ``plugin``: ``Trainer(accelerator="hpu")`` on the emulated HPU, with what the plugin adds by itself
  (strategy, checkpoint IO, host-sync-free logging, progress bar refreshed every 20 steps);
- ``plugin_gaudi_set``: the same plus the Gaudi default callbacks of ``conf/callbacks/default.yaml``.

Every Lightning variant logs to a CSV logger (every 50 steps, Lightning's default) and renders its progress bar
into /dev/null. The target is ``plugin / stock >= 0.99``.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from lightning.pytorch import Trainer, seed_everything
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
VARIANTS = ("hand", "stock", "plugin", "plugin_gaudi_set")


def _hand(workload: Workload, steps: int, warmup: int, mode: str | None) -> float:
    import time

    with emulation(mode):
        from lightning_gaudi import hpu

        backend = hpu.get_backend()
        device = backend.device()
        lazy = backend.is_lazy()
        seed_everything(0, verbose=False)
        model = BenchModel(workload).to(device)
        optimizer = model.configure_optimizers()
        start = 0.0
        for index, (x, y) in enumerate(make_loader(workload, steps)):
            if index == warmup:
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = model.loss((x.to(device), y.to(device)))
            loss.backward()
            if lazy:
                backend.mark_step()
            optimizer.step()
            if lazy:
                backend.mark_step()
        backend.synchronize()
        return (steps - warmup) / (time.perf_counter() - start)


def _lightning(workload: Workload, steps: int, warmup: int, variant: str, mode: str | None) -> float:
    with tempfile.TemporaryDirectory() as tmp, emulation(mode if variant != "stock" else None):
        seed_everything(0, verbose=False)
        timer = StepTimer(warmup)
        callbacks: list[Any] = [timer]
        if variant == "plugin_gaudi_set":
            callbacks += gaudi_callbacks()[1]
        accelerator = "cpu" if variant == "stock" else "hpu"
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
        return timer.steps_per_second()


def run(quick: bool = False, mode: str | None = "eager") -> dict[str, Any]:
    """Runs the alternation and returns steps/s per variant and the ratios.

    Args:
        quick: a seconds-long smoke run (numbers meaningless).
        mode: ``"eager"`` (emulation) or ``None`` (a real Gaudi: the ``stock`` CPU variant is left out, since stock
            Lightning has no HPU and a CPU figure would not compare).
    """
    import lightning_gaudi  # noqa: F401 - registers "hpu"

    workload = Workload()
    steps, warmup, repetitions = (12, 4, 1) if quick else (300, 30, 5)
    variants = [v for v in VARIANTS if mode is not None or v != "stock"]
    measured: dict[str, list[float]] = {v: [] for v in variants}
    for repetition in range(repetitions):
        order = variants[repetition % len(variants) :] + variants[: repetition % len(variants)]
        for variant in order:
            if variant == "hand":
                value = _hand(workload, steps, warmup, mode)
            else:
                value = _lightning(workload, steps, warmup, variant, mode)
            measured[variant].append(value)
            log(f"  overhead rep {repetition + 1}/{repetitions} {variant:>16}: {value:8.1f} steps/s")
    ratios = {"plugin/hand": ratio_summary(measured["plugin"], measured["hand"])}
    ratios["plugin_gaudi_set/hand"] = ratio_summary(measured["plugin_gaudi_set"], measured["hand"])
    if "stock" in measured:
        ratios["plugin/stock"] = ratio_summary(measured["plugin"], measured["stock"])
        ratios["plugin_gaudi_set/stock"] = ratio_summary(measured["plugin_gaudi_set"], measured["stock"])
        ratios["stock/hand"] = ratio_summary(measured["stock"], measured["hand"])
    return {
        "workload": workload.as_dict(),
        "parameters": parameter_count(BenchModel(workload)),
        "steps": steps,
        "warmup_steps": warmup,
        "repetitions": repetitions,
        "torch_threads": torch.get_num_threads(),
        "gaudi_set": gaudi_callbacks()[0],
        "steps_per_s": {v: summarize(values) for v, values in measured.items()},
        "ratios": ratios,
        "target": {"plugin/stock": TARGET},
        "met": None if "stock" not in measured else ratios["plugin/stock"]["median"] >= TARGET,
    }
