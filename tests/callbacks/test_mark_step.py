"""MarkStep: where lazy mode cuts the graph, counted through the seam (LTC's MarkStep counter, the bridge double)."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
from helpers.workload import CounterWindow, Workload, loader, quiet_trainer

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import MarkStep
from lightning_gaudi.callbacks.mark_step import add_default_mark_step


def test_lazy_default_two_mark_steps_per_step_and_no_recompilation(lazy_hpu: hpu.Backend) -> None:
    window = CounterWindow(start=3, stop=13)
    trainer = quiet_trainer(callbacks=[window])
    trainer.fit(Workload(), loader(16))
    defaults = [c for c in trainer.callbacks if isinstance(c, MarkStep)]
    assert len(defaults) == 1
    assert trainer.callbacks[0] is defaults[0], "the default MarkStep runs before every other callback"
    assert window.delta("mark_steps") == 2 * 10
    assert window.delta("graph_compilations") == 0


def test_lazy_gradient_accumulation_k_plus_one(lazy_hpu: hpu.Backend) -> None:
    window = CounterWindow()
    trainer = quiet_trainer(callbacks=[window], accumulate_grad_batches=3)
    trainer.fit(Workload(), loader(12))
    assert trainer.global_step == 4
    assert window.delta("mark_steps") == 4 * (3 + 1)


def test_lazy_eval_batches_and_extra_forward_point(lazy_hpu: hpu.Backend) -> None:
    marker = MarkStep(after_forward=True)
    window = CounterWindow()
    trainer = quiet_trainer(callbacks=[marker, window])
    trainer.fit(Workload(), loader(5))
    assert [c for c in trainer.callbacks if isinstance(c, MarkStep)] == [marker], "a configured MarkStep wins"
    assert window.delta("mark_steps") == 3 * 5

    trainer = quiet_trainer(limit_val_batches=1.0, inference_mode=False)  # LTC cannot run under inference_mode
    for run in (trainer.validate, trainer.test):
        before = lazy_hpu.lazy_counters()
        run(Workload(), loader(4), verbose=False)
        assert lazy_hpu.lazy_counters().mark_steps - before.mark_steps == 4
    before = lazy_hpu.lazy_counters()
    trainer.predict(Workload(), loader(3))
    assert lazy_hpu.lazy_counters().mark_steps - before.mark_steps == 3


def test_lazy_turned_off(lazy_hpu: hpu.Backend) -> None:
    window = CounterWindow()
    trainer = quiet_trainer(callbacks=[MarkStep(enabled=False), window])
    trainer.fit(Workload(), loader(4))
    assert window.delta("mark_steps") == 0


def test_eager_adds_nothing_and_marks_nothing(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[None] = []
    monkeypatch.setattr(eager_hpu, "mark_step", lambda: calls.append(None))
    trainer = quiet_trainer()
    trainer.fit(Workload(), loader(4))
    assert not any(isinstance(c, MarkStep) for c in trainer.callbacks)

    trainer = quiet_trainer(callbacks=[MarkStep(after_forward=True)], limit_val_batches=2)
    trainer.fit(Workload(), loader(4), loader(2))
    assert calls == []


def _drive_one_step(marker: MarkStep) -> None:
    marker.setup(None, None, "fit")  # type: ignore[arg-type]
    marker.on_before_backward(None, None, None)  # type: ignore[arg-type]
    marker.on_after_backward(None, None)  # type: ignore[arg-type]
    marker.on_before_optimizer_step(None, None, None)  # type: ignore[arg-type]
    marker.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
    marker.on_validation_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]


def test_bridge_lazy_calls_core_mark_step(bridge_double: ModuleType) -> None:
    trainer = SimpleNamespace(callbacks=[object()])
    added = add_default_mark_step(trainer)  # type: ignore[arg-type]
    assert isinstance(added, MarkStep)
    assert trainer.callbacks[0] is added
    assert add_default_mark_step(trainer) is None  # type: ignore[arg-type]

    bridge_double.reset()
    _drive_one_step(MarkStep())
    assert len(bridge_double.called("core.mark_step")) == 3  # backward, optimizer step, validation batch
    bridge_double.reset()
    _drive_one_step(MarkStep(after_forward=True))
    assert len(bridge_double.called("core.mark_step")) == 4


def test_bridge_eager_mode_marks_nothing(bridge_double: ModuleType) -> None:
    bridge_double.configure(lazy=False)
    trainer = SimpleNamespace(callbacks=[])
    assert add_default_mark_step(trainer) is None  # type: ignore[arg-type]
    _drive_one_step(MarkStep(after_forward=True))
    assert bridge_double.called("core.mark_step") == []
