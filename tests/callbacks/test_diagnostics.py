"""LazyModeDiagnostics: quiet on a fixed-shape loop, warns once on a recompilation or a CPU fallback."""

from __future__ import annotations

import warnings
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from torch import Tensor, nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import LazyModeDiagnostics
from lightning_gaudi.callbacks.diagnostics import BRIDGE_LOG_HINT

# A batch size no other test uses: Lazy Tensor Core keeps compiled graphs for the life of the process, so shapes
# another test already ran would compile nothing here.
BATCH_SIZE = 6


def _fit(model: Workload, batches: int, ragged: int = 0) -> tuple[LazyModeDiagnostics, list[str]]:
    diagnostics = LazyModeDiagnostics(warmup_steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(callbacks=[diagnostics]).fit(model, loader(batches, batch_size=BATCH_SIZE, ragged=ragged))
    return diagnostics, [str(w.message) for w in caught if "Training batch" in str(w.message)]


def test_lazy_fixed_shapes_are_quiet(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(Workload(), 8)
    assert messages == []
    summary = diagnostics.summary
    assert summary["steps"] == 8
    assert summary["warmup_compilations"] > 0
    assert summary["compilations_after_warmup"] == 0
    assert summary["cpu_fallbacks"] == {}
    assert summary["host_syncs"] == 0


def test_lazy_ragged_last_batch_warns_once_naming_drop_last(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(Workload(), 6, ragged=5)
    assert len(messages) == 1
    assert "batch 6 compiled" in messages[0]
    assert "[(5, 8), (5, 1)]" in messages[0]
    assert "drop_last=True" in messages[0]
    assert diagnostics.summary["compilations_after_warmup"] > 0


class StepConstant(Workload):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return ((self(x) - y) ** 2).mean() + x[:, batch_idx % x.shape[1]].mean()  # a loop index baked into the graph


def test_lazy_changing_python_number_is_named(lazy_hpu: hpu.Backend) -> None:
    _, messages = _fit(StepConstant(), 6)
    assert len(messages) == 1
    assert "Python number that changes every step" in messages[0]


class Fallback(Workload):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)  # Lazy Tensor Core runs mse_loss on the CPU


def test_lazy_cpu_fallbacks_by_op(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(Fallback(), 5)
    assert len(messages) == 1
    assert "mse_loss" in messages[0]
    assert diagnostics.summary["cpu_fallbacks"]["mse_loss"] == 5


def test_eager_does_nothing(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eager_hpu, "lazy_counters", lambda: pytest.fail("counters read in eager mode"))
    diagnostics, messages = _fit(Workload(), 4, ragged=1)
    assert messages == []
    assert diagnostics.summary == {}


def _set_counts(state: ModuleType, compilations: int, fallbacks: dict[str, int]) -> None:
    state.config.metrics["graph_compilation"] = [("TotalNumber", compilations), ("TotalTime", 0), ("AvgTime", 0)]
    state.config.metrics["cpu_fallback"] = [("TotalNumber", sum(fallbacks.values())), ("FallbackOps", fallbacks)]


def test_bridge_counts_from_metric_global(bridge_double: ModuleType) -> None:
    diagnostics = LazyModeDiagnostics(warmup_steps=1)
    trainer: Any = SimpleNamespace()
    diagnostics.on_fit_start(trainer, None)  # type: ignore[arg-type]
    batch = torch.zeros(4, 2)
    timeline = [(5, {}), (5, {}), (6, {"digamma": 1})]  # counts at the end of each batch
    _set_counts(bridge_double, 0, {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, (compilations, fallbacks) in enumerate(timeline):
            diagnostics.on_train_batch_start(trainer, None, batch, index)  # type: ignore[arg-type]
            _set_counts(bridge_double, compilations, fallbacks)
            diagnostics.on_train_batch_end(trainer, None, None, batch, index)  # type: ignore[arg-type]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "batch 2 compiled 1 new graph" in messages[0]
    assert "digamma" in messages[1]
    assert all(BRIDGE_LOG_HINT in message for message in messages)
    diagnostics.on_fit_end(trainer, None)  # type: ignore[arg-type]
    assert diagnostics.summary["compilations_after_warmup"] == 1
    assert diagnostics.summary["warmup_compilations"] == 5
    assert diagnostics.summary["host_syncs"] is None


def test_bad_warmup() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        LazyModeDiagnostics(warmup_steps=-2)
