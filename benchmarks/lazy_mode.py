"""Lazy mode: stock-Lightning-style usage against the plugin's defaults, under ``LIGHTNING_GAUDI_EMULATE=lazy``.

Variants, alternated in rotating order, on the same model (loss logged to the progress bar every step):

- ``stock``: what a Lightning user gets by adding ``mark_step`` to the loop (a :class:`MarkStep` callback) and nothing
  else: Lightning's own logging (each ``prog_bar`` value read to the host at every batch end) and its default progress
  bar (refreshed every step). The plugin's logging wrappers are told to stand aside for this variant;
- ``plugin``: ``Trainer(accelerator="hpu")`` as it comes: the default MarkStep, host-sync-free logging, a progress
  bar refreshed every 20 steps;
- ``plugin_gaudi_set``: the same plus the Gaudi default callbacks of ``conf/callbacks/default.yaml``.

No logger is attached: a logger adds one host sync per logged value every ``log_every_n_steps`` (50 by default,
0.02 per step), whatever the plugin does. Counters come from the seam (``hpu.get_backend().lazy_counters()``),
read at the start of the first batch after warm-up and at the end of the last batch (after the device finished).
Targets: 0 graph compilations after warm-up and at most 0.05 host syncs per step for the plugin. Speed ratios use
steps per CPU-second of the process (``ratios``; Lazy Tensor Core runs the graphs in this process) and, beside
them, steps per wall-clock second (``ratios_wall``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

from benchmarks.common import (
    BenchModel,
    Workload,
    emulation,
    gaudi_callbacks,
    log,
    make_loader,
    quiet,
    ratio_summary,
    summarize,
    trainer_kwargs,
)

TARGETS = {"compilations_after_warmup": 0, "host_syncs_per_step": 0.05}
VARIANTS = ("stock", "plugin", "plugin_gaudi_set")


class LazyWindow(Callback):
    """Lazy counters and time over training batches ``warmup`` .. ``last`` (inclusive), every callback included.

    Read at the start of batch ``warmup`` and at the start of batch ``last + 1`` (so the fit needs one more batch):
    whatever any callback does at the end of batch ``last`` (the progress bar refreshing) falls inside the window.
    """

    def __init__(self, warmup: int, last: int) -> None:
        from lightning_gaudi import hpu

        self.backend = hpu.get_backend()
        self.warmup = warmup
        self.last = last
        self.begin: Any = None
        self.end: Any = None
        self.start_time = self.end_time = self.start_cpu = self.end_cpu = 0.0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.backend.synchronize()
            self.begin = self.backend.lazy_counters()
            self.start_time, self.start_cpu = time.perf_counter(), time.process_time()

        if batch_idx == self.last + 1:
            self.backend.synchronize()
            self.end_time, self.end_cpu = time.perf_counter(), time.process_time()
            self.end = self.backend.lazy_counters()

    def result(self) -> dict[str, Any]:
        if self.begin is None or self.end is None:
            raise RuntimeError(f"the lazy window never closed (warmup={self.warmup}, last={self.last})")
        steps = self.last - self.warmup + 1

        def per_step(name: str) -> float | None:  # the real bridge cannot count host syncs and mark_steps
            end, begin = getattr(self.end, name), getattr(self.begin, name)
            return None if end is None or begin is None else (end - begin) / steps

        fallbacks = {
            op: count - self.begin.cpu_fallbacks.get(op, 0)
            for op, count in self.end.cpu_fallbacks.items()
            if count - self.begin.cpu_fallbacks.get(op, 0)
        }
        return {
            "steps": steps,
            "steps_per_s": steps / (self.end_time - self.start_time),
            "steps_per_cpu_s": steps / (self.end_cpu - self.start_cpu),
            "compilations_after_warmup": self.end.graph_compilations - self.begin.graph_compilations,
            "host_syncs_per_step": per_step("host_syncs"),
            "mark_steps_per_step": per_step("mark_steps"),
            "cpu_fallbacks_per_step": sum(fallbacks.values()) / steps,
            "cpu_fallback_ops": sorted(fallbacks),
        }


@contextlib.contextmanager
def _stock_logging() -> Iterator[None]:
    """The plugin's logging wrappers stand aside: Lightning's own per-step behaviour (as in the plugin's tests)."""
    from lightning_gaudi.patches import sync_free_logging

    on_hpu = sync_free_logging._on_hpu
    sync_free_logging._on_hpu = lambda trainer: False  # type: ignore[assignment]
    try:
        yield
    finally:
        sync_free_logging._on_hpu = on_hpu


def _fit(workload: Workload, steps: int, warmup: int, variant: str) -> dict[str, float]:
    from lightning_gaudi.callbacks import MarkStep

    seed_everything(0, verbose=False)
    window = LazyWindow(warmup, steps - 2)
    callbacks: list[Callback] = []
    if variant == "stock":
        callbacks.append(MarkStep())
    elif variant == "plugin_gaudi_set":
        callbacks += gaudi_callbacks()[1]
    callbacks.append(window)
    stock = _stock_logging() if variant == "stock" else contextlib.nullcontext()
    with stock, quiet():
        trainer = Trainer(**trainer_kwargs(steps, accelerator="hpu", callbacks=callbacks))
        trainer.fit(BenchModel(workload), make_loader(workload, steps))
    return window.result()


def run(quick: bool = False, mode: str | None = "lazy") -> dict[str, Any]:
    """Alternates the variants and returns their counters, steps/s and the plugin/stock speed ratio.

    Args:
        quick: a seconds-long smoke run (numbers meaningless).
        mode: ``"lazy"`` (emulation) or ``None`` (a real Gaudi in lazy mode, ``PT_HPU_LAZY_MODE=1``).
    """
    import lightning_gaudi  # noqa: F401 - registers "hpu"

    workload = Workload()
    steps, warmup, repetitions = (10, 4, 1) if quick else (121, 20, 4)  # a window of 100 steps
    measured: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}

    def worst(results: list[dict[str, Any]], key: str) -> Any:
        values = [r[key] for r in results]
        return None if None in values else max(values)

    with emulation(mode):
        from lightning_gaudi import hpu

        if not hpu.get_backend().is_lazy():
            raise RuntimeError("the lazy-mode benchmark needs lazy mode: on Gaudi set PT_HPU_LAZY_MODE=1")
        for repetition in range(repetitions):
            order = VARIANTS[repetition % len(VARIANTS) :] + VARIANTS[: repetition % len(VARIANTS)]
            for variant in order:
                result = _fit(workload, steps, warmup, variant)
                measured[variant].append(result)
                log(
                    f"  lazy rep {repetition + 1}/{repetitions} {variant:>16}: {result['steps_per_s']:6.1f} steps/s,"
                    f" {result['host_syncs_per_step']} syncs/step, {result['compilations_after_warmup']} compilations,"
                    f" {result['mark_steps_per_step']} mark_steps/step"
                )
    variants: dict[str, Any] = {}
    for variant, results in measured.items():
        variants[variant] = {
            "steps_per_s": summarize([r["steps_per_s"] for r in results]),
            "steps_per_cpu_s": summarize([r["steps_per_cpu_s"] for r in results]),
            "host_syncs_per_step": worst(results, "host_syncs_per_step"),
            "compilations_after_warmup": worst(results, "compilations_after_warmup"),
            "mark_steps_per_step": worst(results, "mark_steps_per_step"),
            "cpu_fallbacks_per_step": worst(results, "cpu_fallbacks_per_step"),
            "cpu_fallback_ops": sorted({op for r in results for op in r["cpu_fallback_ops"]}),
        }
    speed = {v: [r["steps_per_cpu_s"] for r in measured[v]] for v in VARIANTS}
    speed_wall = {v: [r["steps_per_s"] for r in measured[v]] for v in VARIANTS}
    plugin = variants["plugin"]
    return {
        "workload": workload.as_dict(),
        "steps": steps,
        "warmup_steps": warmup,
        "repetitions": repetitions,
        "gaudi_set": gaudi_callbacks()[0],
        "variants": variants,
        "ratios": {
            "plugin/stock": ratio_summary(speed["plugin"], speed["stock"]),
            "plugin_gaudi_set/stock": ratio_summary(speed["plugin_gaudi_set"], speed["stock"]),
        },
        "ratios_wall": {
            "plugin/stock": ratio_summary(speed_wall["plugin"], speed_wall["stock"]),
            "plugin_gaudi_set/stock": ratio_summary(speed_wall["plugin_gaudi_set"], speed_wall["stock"]),
        },
        "targets": TARGETS,
        "met": plugin["compilations_after_warmup"] <= TARGETS["compilations_after_warmup"]
        and (plugin["host_syncs_per_step"] or 0.0) <= TARGETS["host_syncs_per_step"],
    }
