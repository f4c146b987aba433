"""The signals patch (``lightning_gaudi/patches/signals.py``): SIGTERM during fit handled by PreemptionCheckpoint.

The canaries run a fit that takes SIGTERM over and fail when the handler Lightning registers for SIGTERM during the fit
is not the one given, when Lightning's per-batch broadcast still runs, or when Lightning's signal connector stops
registering its bound notifier (or its loop stops calling the broadcast the patch skips).
"""

from __future__ import annotations

import inspect
import signal
import warnings
from typing import Any

import pytest
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi.patches import registry, signals


def test_installed_after_import() -> None:
    assert signals.installed()
    assert signals.PATCH.installed()


def test_lightning_still_registers_its_notifier_and_broadcasts_per_batch() -> None:
    """Canary: what take_over_sigterm replaces, where Lightning uses it."""
    assert signals.missing_targets() == []
    assert "self._sigterm_notifier_fn" in inspect.getsource(_SignalConnector.register_signal_handlers)
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(_TrainingEpochLoop.advance)


def test_a_fit_calls_the_given_handler_instead_of_lightnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary: during a fit, what SIGTERM calls is the given handler, and the per-batch broadcast never runs."""
    received: list[int] = []

    def broadcast(self: Any) -> None:
        raise AssertionError("Lightning's per-batch SIGTERM broadcast ran")

    monkeypatch.setattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor", broadcast)

    class TakeOver(Callback):
        def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
            assert signals.take_over_sigterm(trainer, lambda signum, frame: received.append(signum))

        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            if trainer.global_step == 1:
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # type: ignore[operator]

    before = signal.getsignal(signal.SIGTERM)
    trainer = quiet_trainer(accelerator="cpu", callbacks=[TakeOver()], max_steps=2)  # no PreemptionCheckpoint
    trainer.fit(Workload(), loader(4))
    assert received == [signal.SIGTERM], "Lightning no longer registers the trainer's notifier for SIGTERM"
    assert not trainer.received_sigterm
    assert signal.getsignal(signal.SIGTERM) == before  # Lightning restored the handler when the fit ended


def test_take_over_and_release_touch_only_one_trainer() -> None:
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    other = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    calls: list[int] = []

    def handler(signum: int, frame: object) -> None:
        calls.append(signum)

    assert signals.take_over_sigterm(trainer, handler)
    assert trainer._signal_connector._sigterm_notifier_fn is handler
    assert trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor() is None  # skipped: no process group needed
    assert other._signal_connector._sigterm_notifier_fn != handler
    signals.release_sigterm(trainer)
    assert trainer._signal_connector._sigterm_notifier_fn != handler
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)


def test_unsupported_lightning_takes_nothing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(signals._State, "enabled", False)
    with pytest.warns(UserWarning, match="SIGTERM is left to Lightning"):
        assert not signals.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not signals.take_over_sigterm(Trainer(logger=False), lambda signum, frame: None)
