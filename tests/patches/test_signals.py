"""The signals patch (``lightning_gaudi/patches/signals.py``): SIGTERM during fit handled by PreemptionCheckpoint.

The canaries fail when Lightning's signal connector stops registering its bound SIGTERM notifier, or its training
loop stops calling the per-batch SIGTERM broadcast the patch skips.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
from lightning.pytorch import Trainer
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
