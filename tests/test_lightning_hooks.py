"""The connector hooks in ``lightning_gaudi/_lightning.py``, and the stock Lightning behaviour they replace.

These tests fail loudly when Lightning changes what the hooks rely on: a renamed connector method or attribute, a
new version outside the checked range, or a change in the stock behaviour (for instance Lightning choosing an
HPU strategy on its own again, which would make a hook unnecessary).
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning
import pytest
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUParallelStrategy, HPUPrecision, _lightning, hpu

HOOKED = ("_choose_auto_accelerator", "_choose_strategy", "_check_and_init_precision")
#: Connector instance attributes the wrappers read.
INSTANCE_ATTRIBUTES = (
    "_accelerator_flag",
    "_num_nodes_flag",
    "_parallel_devices",
    "_precision_flag",
    "_precision_plugin_flag",
    "accelerator",
)


def _stock(name: str) -> Any:
    return getattr(_AcceleratorConnector, name).__wrapped__


def test_installed_lightning_is_a_checked_version() -> None:
    assert RequirementCache(_lightning.SUPPORTED_LIGHTNING), (
        f"lightning {lightning.__version__} is outside {_lightning.SUPPORTED_LIGHTNING}: re-check the connector"
        " hooks in lightning_gaudi/_lightning.py against it, then widen the range."
    )


def test_connector_methods_exist() -> None:
    for name in _lightning.CONNECTOR_ATTRIBUTES:
        assert callable(getattr(_AcceleratorConnector, name, None)), f"Lightning's connector lost {name}"
    assert isinstance(_AcceleratorConnector.__dict__["_choose_auto_accelerator"], staticmethod)


def test_hooks_are_installed_once() -> None:
    assert _lightning.connector_hooks_installed()
    before = {name: _AcceleratorConnector.__dict__[name] for name in HOOKED}
    assert _lightning.install_connector_hooks() is True
    after = {name: _AcceleratorConnector.__dict__[name] for name in HOOKED}
    assert before == after  # not wrapped twice
    for name in HOOKED:
        assert not getattr(_stock(name), _lightning._MARK, False)  # one layer: the stock method underneath


def test_connector_has_the_attributes_the_hooks_read(eager_hpu: hpu.Backend) -> None:
    connector = Trainer(accelerator="hpu", devices=2, logger=False)._accelerator_connector
    for name in INSTANCE_ATTRIBUTES:
        assert hasattr(connector, name), f"Lightning's connector lost the attribute {name}"


def test_stock_strategy_choice_still_refuses_hpu(eager_hpu: hpu.Backend) -> None:
    connector = Trainer(accelerator="hpu", devices=1, logger=False)._accelerator_connector
    assert connector._accelerator_flag == "hpu"
    with pytest.raises(MisconfigurationException, match="HPU is currently not supported"):
        _stock("_choose_strategy")(connector)


def test_stock_precision_choice_is_still_cuda_autocast(eager_hpu: hpu.Backend) -> None:
    connector = Trainer(accelerator="hpu", devices=1, logger=False)._accelerator_connector
    connector._precision_flag = "bf16-mixed"
    connector._precision_plugin_flag = None
    plugin = _stock("_check_and_init_precision")(connector)
    assert type(plugin) is MixedPrecision
    assert plugin.device == "cuda"  # what the hook replaces with autocast on the HPU device type


def test_stock_auto_accelerator_does_not_know_hpu(eager_hpu: hpu.Backend) -> None:
    assert _stock("_choose_auto_accelerator")() != "hpu"


def test_other_accelerators_are_left_alone(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="cpu", devices=2, logger=False)
    assert type(trainer.strategy) is DDPStrategy
    trainer = Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", logger=False)
    assert type(trainer.strategy) is SingleDeviceStrategy
    assert type(trainer.precision_plugin) is MixedPrecision
    assert trainer.precision_plugin.device == "cpu"


def test_hooks_take_over_for_hpu(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", devices=2, precision="bf16-mixed", logger=False)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert isinstance(trainer.precision_plugin, HPUPrecision)


def _uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HOOKED:
        stock = _stock(name)
        original = staticmethod(stock) if name == "_choose_auto_accelerator" else stock
        monkeypatch.setattr(_AcceleratorConnector, name, original)
    assert not _lightning.connector_hooks_installed()


def test_unsupported_lightning_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.setattr(_lightning, "_LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    with pytest.warns(UserWarning, match=r"pass `strategy='hpu_single'`"):
        assert _lightning.install_connector_hooks() is False
    assert not _lightning.connector_hooks_installed()


def test_connector_without_a_method_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.delattr(_AcceleratorConnector, "_validate_precision_choice")
    with pytest.warns(UserWarning, match="_validate_precision_choice"):
        assert _lightning.install_connector_hooks() is False
    assert not _lightning.connector_hooks_installed()


def test_hooks_reinstall_after_uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _lightning.install_connector_hooks() is True
    assert _lightning.connector_hooks_installed()
