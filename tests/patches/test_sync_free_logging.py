"""The host-sync-free logging patch (``lightning_gaudi/patches/sync_free_logging.py``): progress-bar values reach
the host only when the bar refreshes or a logger writes.

Counted in lazy emulation with torch's ``aten::_local_scalar_dense`` counter (the seam's ``host_syncs``). The canary
(``test_lightning_internals_the_wrappers_rely_on``) fails when Lightning changes what the wrappers rely on.
"""

from __future__ import annotations

import csv
import inspect
from pathlib import Path

import pytest
from helpers.workload import CounterWindow, Workload, loader, quiet_trainer
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import hpu
from lightning_gaudi.patches import registry, sync_free_logging

WARMUP, STEPS = 20, 200


def _syncs_per_step(**trainer_kwargs: object) -> tuple[float, Trainer]:
    window = CounterWindow(start=WARMUP, stop=WARMUP + STEPS)
    trainer = quiet_trainer(callbacks=[window, *trainer_kwargs.pop("callbacks", [])], **trainer_kwargs)  # type: ignore[list-item,misc]
    trainer.fit(Workload(), loader(WARMUP + STEPS + 4))
    return window.delta("host_syncs") / STEPS, trainer


def test_lazy_default_loop_syncs_only_when_the_bar_refreshes(lazy_hpu: hpu.Backend) -> None:
    per_step, trainer = _syncs_per_step(enable_progress_bar=True)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, TQDMProgressBar)
    assert bar.refresh_rate == sync_free_logging.HPU_PROGRESS_BAR_REFRESH_RATE == 20
    assert per_step <= 0.05
    assert window_graphs_ok(trainer)
    loss = trainer.progress_bar_metrics["loss"]
    assert isinstance(loss, float)
    assert loss == pytest.approx(trainer.callback_metrics["loss"].item())


def window_graphs_ok(trainer: Trainer) -> bool:
    return trainer.global_step == WARMUP + STEPS + 4


def test_stock_lightning_syncs_every_step(lazy_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same loop with the wrappers standing aside: what Lightning alone does (the number issue 3 quotes)."""
    monkeypatch.setattr(sync_free_logging, "_on_hpu", lambda trainer: False)
    per_step, _ = _syncs_per_step(enable_progress_bar=True, callbacks=[TQDMProgressBar(refresh_rate=20)])
    assert per_step >= 1.0


def test_logger_still_gets_numbers(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="", version=""), log_every_n_steps=5)
    trainer.fit(Workload(), loader(20))
    with open(tmp_path / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("loss")]
    assert [int(row["step"]) for row in rows] == [4, 9, 14, 19]
    assert all(float(row["loss"]) >= 0 for row in rows)


@pytest.mark.parametrize(
    ("kwargs", "env", "expected"),
    [
        ({"callbacks": [TQDMProgressBar(refresh_rate=3)]}, {}, 3),  # the user's bar wins
        ({}, {"TQDM_MINITERS": "7"}, 7),  # so does the user's tqdm setting
        ({}, {}, 20),
    ],
)
def test_refresh_default_and_user_settings(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, kwargs: dict, env: dict, expected: int
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    trainer = quiet_trainer(enable_progress_bar=True, **kwargs)
    assert trainer.progress_bar_callback.refresh_rate == expected  # type: ignore[union-attr]


@pytest.mark.skipif(
    not RequirementCache("lightning>=2.6"), reason="Lightning 2.5 picks TQDMProgressBar even with rich (2.6's choice)"
)
def test_other_accelerators_untouched(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    default = RichProgressBar if RequirementCache("rich") else TQDMProgressBar  # Lightning's own choice
    assert type(trainer.progress_bar_callback) is default
    assert trainer.progress_bar_callback.refresh_rate == default().refresh_rate  # type: ignore[union-attr]
    assert quiet_trainer(enable_progress_bar=False).progress_bar_callback is None


def test_hpu_default_bar_is_tqdm_even_with_rich_installed(eager_hpu: hpu.Backend) -> None:
    """Rich's bar reads the logged values at every batch: under HPU the default is tqdm's, whatever is installed."""
    pytest.importorskip("rich")
    trainer = quiet_trainer(enable_progress_bar=True)
    assert type(trainer.progress_bar_callback) is TQDMProgressBar
    user_rich = quiet_trainer(enable_progress_bar=True, callbacks=[RichProgressBar()])
    assert type(user_rich.progress_bar_callback) is RichProgressBar  # the user's choice wins


def test_lightning_internals_the_wrappers_rely_on() -> None:
    """Fails loudly when Lightning changes what the host-sync-free logging wrappers assume."""
    assert sync_free_logging.installed()
    assert sync_free_logging.missing_targets() == [], "Lightning moved or changed what the logging wrappers replace"
    metrics_source = inspect.getsource(_ResultCollection.metrics)
    assert 'metrics["pbar"][forked_name] = convert_tensors_to_scalars(value)' in metrics_source, (
        "Lightning's _ResultCollection.metrics (logger_connector/result.py) no longer turns progress-bar values into"
        " numbers with convert_tensors_to_scalars: re-check the deferral in patches/sync_free_logging.py"
    )
    for name in ("on_batch_end", "on_epoch_end", "update_train_step_metrics"):
        assert "self.metrics" in inspect.getsource(getattr(_LoggerConnector, name)), (
            f"Lightning's _LoggerConnector.{name} no longer reads the `metrics` property the wrappers replace"
        )
    getter = inspect.getsource(inspect.unwrap(_LoggerConnector.progress_bar_metrics.fget))  # type: ignore[attr-defined]
    assert "self.metrics" in getter, "Lightning's _LoggerConnector.progress_bar_metrics no longer reads `metrics`"
    assert "return self._progress_bar_metrics" in getter, (
        "Lightning's _LoggerConnector.progress_bar_metrics no longer returns `_progress_bar_metrics`"
    )
    configure = inspect.signature(inspect.unwrap(_CallbackConnector._configure_progress_bar))
    assert list(configure.parameters) == ["self", "enable_progress_bar"], (
        f"Lightning's _CallbackConnector._configure_progress_bar now takes {list(configure.parameters)}"
    )


def test_unsupported_lightning_warns_and_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_free_logging, "installed", lambda: False)
    monkeypatch.setattr(sync_free_logging, "missing_targets", lambda: ["_LoggerConnector.metrics"])
    before = _LoggerConnector.__dict__["metrics"]
    with pytest.warns(UserWarning, match="read to the host at every step"):
        assert sync_free_logging.install() is False
    assert _LoggerConnector.__dict__["metrics"] is before


def test_lightning_outside_the_checked_range_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(sync_free_logging, "installed", lambda: False)
    before = _LoggerConnector.__dict__["progress_bar_metrics"]
    with pytest.warns(UserWarning, match=r"checked against lightning>=2.5.6"):
        assert sync_free_logging.install() is False
    assert _LoggerConnector.__dict__["progress_bar_metrics"] is before
