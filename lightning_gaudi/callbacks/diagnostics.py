"""Lazy-mode diagnostics: graph compilations, CPU fallbacks and host syncs per training step."""

from __future__ import annotations

from collections import Counter
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.callbacks.memory_stats import check_interval

#: How to see the bridge's own logs of CPU fallbacks (and compilations) on Gaudi.
BRIDGE_LOG_HINT = "ENABLE_CONSOLE=true LOG_LEVEL_PT_FALLBACK=1"


def batch_shapes(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensors in ``batch`` (host metadata: no device access)."""
    if isinstance(batch, Tensor):
        return (tuple(batch.shape),)
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return tuple(shape for item in batch for shape in batch_shapes(item))
    return ()


class LazyModeDiagnostics(Callback):
    """Counts graph compilations, CPU fallbacks (by op) and host syncs in each training step of a lazy-mode run.

    After ``warmup_steps`` training batches the graphs should be cached: the first later compilation is warned about
    once, naming its likely cause (a batch of a new shape, such as a ragged last batch; a Python number that changes
    every step baked into the graph; dynamic shapes). The first CPU fallback after warm-up is warned about once too.
    A summary is printed at the end of fit and kept in :attr:`summary`. On Gaudi the counts come from the bridge's
    ``metric_global`` (host syncs are not counted there); in lazy emulation from torch's Lazy Tensor Core counters.
    Outside lazy mode it does nothing. Validation batches are not counted.

    Args:
        warmup_steps: training batches allowed to compile graphs.

    Raises:
        ValueError: a negative ``warmup_steps``.
    """

    def __init__(self, warmup_steps: int = 3) -> None:
        check_interval("warmup_steps", warmup_steps, allow_zero=True)
        self.warmup_steps = warmup_steps
        self.summary: dict[str, Any] = {}
        self._backend: hpu.Backend | None = None
        self._reset()

    def _reset(self) -> None:
        self._steps = 0
        self._compilations = [0, 0]  # during warm-up, after it
        self._fallbacks: Counter[str] = Counter()
        self._late_fallbacks: Counter[str] = Counter()
        self._host_syncs: int | None = None
        self._before: hpu.LazyCounters | None = None
        self._shapes: set[tuple[tuple[int, ...], ...]] = set()
        self._warned_compile = self._warned_fallback = False

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        backend = hpu.get_backend()
        self._backend = backend if backend.is_lazy() else None
        self._reset()
        self.summary = {}

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._backend is not None:
            self._before = self._backend.lazy_counters()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._backend is None or self._before is None:
            return
        after = self._backend.lazy_counters()
        before, self._before = self._before, None
        if after is None:
            return
        warm = self._steps >= self.warmup_steps
        self._steps += 1
        compiled = after.graph_compilations - before.graph_compilations
        self._compilations[warm] += compiled
        fallbacks = Counter(after.cpu_fallbacks)
        fallbacks.subtract(before.cpu_fallbacks)
        fallbacks = +fallbacks
        self._fallbacks.update(fallbacks)
        if after.host_syncs is not None and before.host_syncs is not None:
            self._host_syncs = (self._host_syncs or 0) + after.host_syncs - before.host_syncs
        shapes = batch_shapes(batch)
        new_shape = bool(self._shapes) and shapes not in self._shapes
        self._shapes.add(shapes)
        if not warm:
            return
        self._late_fallbacks.update(fallbacks)
        if compiled and not self._warned_compile:
            self._warned_compile = True
            rank_zero_warn(self._compile_message(batch_idx, compiled, shapes if new_shape else None))
        if fallbacks and not self._warned_fallback:
            self._warned_fallback = True
            rank_zero_warn(
                f"Training batch {batch_idx} ran {', '.join(sorted(fallbacks))} on the CPU (an op the device lacks):"
                " every step pays a device-to-host round trip." + self._bridge_hint()
            )

    def _compile_message(self, batch_idx: int, compiled: int, new_shapes: tuple[tuple[int, ...], ...] | None) -> str:
        head = (
            f"Training batch {batch_idx} compiled {compiled} new graph(s) after the {self.warmup_steps} warm-up steps;"
            " each compilation stalls training."
        )
        if new_shapes is not None:
            return (
                f"{head} Likely cause: this batch has new shapes {list(new_shapes)} (e.g. the ragged last batch of"
                " an epoch). Use `DataLoader(..., drop_last=True)` or pad batches to a fixed size."
                + self._bridge_hint()
            )
        return (
            f"{head} Likely causes: a Python number that changes every step (a loop index, a step counter, a"
            " schedule value) used in a tensor op, which bakes it into the graph as a constant (pass it as a tensor"
            " instead); or dynamic shapes (boolean masks, `nonzero`, data-dependent sizes)." + self._bridge_hint()
        )

    def _bridge_hint(self) -> str:
        if self._backend is None or self._backend.emulated:
            return ""
        return f" Run with {BRIDGE_LOG_HINT} to see the bridge's own log."

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._backend is None or not self._steps:
            return
        after_warmup = max(self._steps - self.warmup_steps, 0)
        self.summary = {
            "steps": self._steps,
            "warmup_compilations": self._compilations[0],
            "compilations_after_warmup": self._compilations[1],
            "compilations_per_step_after_warmup": self._compilations[1] / after_warmup if after_warmup else 0.0,
            "cpu_fallbacks": dict(self._fallbacks),
            "host_syncs": self._host_syncs,
            "host_syncs_per_step": None if self._host_syncs is None else self._host_syncs / self._steps,
        }
        fallbacks = ", ".join(f"{op} x{count}" for op, count in self._fallbacks.most_common()) or "none"
        syncs = (
            "not counted by this backend" if self._host_syncs is None else f"{self._host_syncs / self._steps:.3f}/step"
        )
        rank_zero_info(
            f"Lazy-mode diagnostics over {self._steps} training steps: graph compilations {self._compilations[0]} in"
            f" the {self.warmup_steps} warm-up steps, {self._compilations[1]} after; CPU fallbacks: {fallbacks};"
            f" host syncs: {syncs}." + self._bridge_hint()
        )
