"""The device-info patch (``lightning_gaudi/patches/device_info.py``): one "HPU available" line, saying what runs,
beside Lightning's GPU and TPU lines when a Trainer is built.

The canary (``test_lightning_still_logs_devices_where_the_patch_wraps``) fails when Lightning moves the function
that logs those lines or the call in ``Trainer.__init__``.
"""

from __future__ import annotations

import inspect
import logging
import re
from types import ModuleType

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.trainer import setup
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import hpu
from lightning_gaudi.patches import device_info, registry


def _device_lines(caplog: pytest.LogCaptureFixture, **trainer_kwargs: object) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **trainer_kwargs)  # type: ignore[arg-type]
    return [r.getMessage() for r in caplog.records if " available: " in r.getMessage()]


def test_installed_after_import() -> None:
    assert device_info.installed()
    assert device_info.PATCH.installed()


def test_lightning_still_logs_devices_where_the_patch_wraps() -> None:
    """Canary: Lightning's device lines come from ``setup._log_device_info(trainer)``, called by the Trainer."""
    original = inspect.unwrap(setup._log_device_info)
    assert list(inspect.signature(original).parameters) == ["trainer"], (
        "Lightning's lightning.pytorch.trainer.setup._log_device_info changed its parameters"
    )
    assert 'rank_zero_info(f"TPU available:' in inspect.getsource(original), (
        "Lightning's _log_device_info no longer logs the TPU line the HPU line is meant to follow"
    )
    assert "setup._log_device_info(self)" in inspect.getsource(Trainer.__init__), (
        "Trainer.__init__ no longer calls setup._log_device_info(self): the HPU line would be lost"
    )


def test_one_card_in_eager_emulation(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    lines = _device_lines(caplog, accelerator="hpu", devices=1)
    assert [line.split(":")[0] for line in lines] == ["GPU available", "TPU available", "HPU available"]
    line = lines[-1]
    assert re.match(
        r"HPU available: True \(GAUDI2, EMULATED on the CPU in eager mode, \d+ torch threads?\), using: 1 HPU,"
        r" strategy SingleHPUStrategy\.",
        line,
    ), line
    assert f"Emulation ({hpu.EMULATE_ENV}=eager" in line
    assert "numbers from this run are CPU numbers" in line
    assert "8" not in line  # the emulated server's card count is not what this run uses


def test_said_once_by_rank_zero_only(
    eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len([line for line in _device_lines(caplog, accelerator="hpu", devices=1) if "EMULATED" in line]) == 1
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert not [line for line in _device_lines(caplog, accelerator="hpu", devices=1) if "HPU" in line]


def test_cards_and_strategy_of_a_ddp_run(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    line = _device_lines(caplog, accelerator="hpu", devices=2, strategy="hpu_parallel")[-1]
    assert "using: 2 HPUs, strategy HPUParallelStrategy." in line


def test_lazy_emulation(lazy_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    line = _device_lines(caplog, accelerator="hpu")[-1]
    assert line.startswith("HPU available: True (GAUDI2, EMULATED on the CPU in lazy mode, ")
    assert "), using: 1 HPU, strategy SingleHPUStrategy." in line


def test_a_gaudi_is_not_called_emulated(bridge_double: ModuleType, caplog: pytest.LogCaptureFixture) -> None:
    line = _device_lines(caplog, accelerator="hpu", devices=1)[-1]
    assert line == "HPU available: True (GAUDI2, lazy mode), using: 1 HPU, strategy SingleHPUStrategy"


def test_other_accelerators_get_a_line_without_loading_anything(
    clean_hpu_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_hpu_env.setattr(hpu.runtime, "bridge_installed", lambda: False)
    assert _device_lines(caplog, accelerator="cpu")[-1] == "HPU available: False, using: 0 HPUs"
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    assert _device_lines(caplog, accelerator="cpu")[-1] == "HPU available: True, using: 0 HPUs"
    assert not hpu._backends  # no backend was created for a CPU trainer
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "bogus")
    assert _device_lines(caplog, accelerator="cpu")[-1] == "HPU available: False, using: 0 HPUs"


def test_lightning_outside_the_checked_range_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(device_info, "installed", lambda: False)
    before = setup._log_device_info
    with pytest.warns(UserWarning, match="will not log an 'HPU available' line"):
        assert device_info.install() is False
    assert setup._log_device_info is before
