"""The accelerator-connector shim (``lightning_gaudi/patches/connector.py``) and the stock behaviour it replaces.

These tests fail loudly when Lightning changes what the wrappers rely on: a Trainer built with a recording policy
must call every hook with the connector's flags and build what the hooks answer; a renamed connector method or
attribute, a new version outside the checked range, or a change in the stock behaviour (for instance Lightning
choosing an HPU strategy on its own again, which would make a wrapper unnecessary) fail too.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu
from lightning_gaudi.patches import connector, registry

UPSTREAM = "lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector"


def _stock(name: str) -> Any:
    return getattr(_AcceleratorConnector, name).__wrapped__


def test_installed_after_import() -> None:
    assert connector.installed()
    assert connector.PATCH.installed()


class Recording:
    """A policy that records what the wrappers ask and answers with what it was told to."""

    def __init__(self, strategy: Any = None, precision: Any = None) -> None:
        self.calls: dict[str, tuple[Any, ...]] = {}
        self.strategy, self.plugin = strategy, precision

    def check_flags(self, strategy: Any, accelerator: Any, registered: Any) -> None:
        self.calls["check_flags"] = (strategy, accelerator, "ddp" in registered)

    def auto_accelerator(self) -> str | None:
        self.calls["auto_accelerator"] = ()
        return "cpu"

    def devices(self, accelerator: Any, strategy: Any, devices: Any) -> Any:
        self.calls["devices"] = (accelerator, strategy, devices)
        return 1

    def choose_strategy(self, accelerator: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        self.calls["choose_strategy"] = (accelerator, len(parallel_devices), num_nodes)
        return self.strategy

    def check_strategy(self, accelerator: Any, strategy: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        self.calls["check_strategy"] = (accelerator, strategy, num_nodes)
        return strategy

    def precision(self, accelerator: Any, strategy: Any, precision: Any, plugin: Any, validate: Any) -> Any:
        self.calls["precision"] = (type(accelerator).__name__, type(strategy).__name__, precision, plugin)
        if self.plugin is not None:
            validate()
        return self.plugin


def test_a_trainer_is_built_through_every_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary: building a Trainer runs each wrapper, with the connector's flags, and builds what the policy answers."""
    chosen, plugin = SingleDeviceStrategy(device="cpu"), MixedPrecision("bf16-mixed", "cpu")
    policy = Recording(strategy=chosen, precision=plugin)
    monkeypatch.setattr(connector.HOOKS, "policy", policy)
    trainer = Trainer(precision="bf16-mixed", logger=False, enable_checkpointing=False)  # accelerator, devices "auto"
    assert policy.calls == {
        "check_flags": ("auto", "auto", True),
        "auto_accelerator": (),
        "devices": ("cpu", "auto", "auto"),
        "choose_strategy": ("cpu", 1, 1),
        "check_strategy": ("cpu", chosen, 1),
        "precision": ("CPUAccelerator", "SingleDeviceStrategy", "bf16-mixed", None),
    }, f"{UPSTREAM} no longer runs the wrapped steps as the shim expects"
    assert trainer.strategy is chosen
    assert trainer.precision_plugin is plugin
    assert trainer.num_devices == 1


def test_without_a_policy_the_wrappers_leave_everything_to_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connector.HOOKS, "policy", None)
    assert not connector.installed()
    trainer = Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", logger=False)
    assert type(trainer.strategy) is SingleDeviceStrategy
    assert type(trainer.precision_plugin) is MixedPrecision


def test_connector_methods_exist() -> None:
    for name in connector.CONNECTOR_ATTRIBUTES:
        assert callable(getattr(_AcceleratorConnector, name, None)), f"Lightning's {UPSTREAM} lost {name}"
    assert isinstance(_AcceleratorConnector.__dict__["_choose_auto_accelerator"], staticmethod), (
        f"{UPSTREAM}._choose_auto_accelerator is no longer a staticmethod"
    )


def test_hooks_are_installed_once() -> None:
    before = {name: _AcceleratorConnector.__dict__[name] for name in connector.WRAPPED}
    assert connector.install() is True
    after = {name: _AcceleratorConnector.__dict__[name] for name in connector.WRAPPED}
    assert before == after  # not wrapped twice
    for name in connector.WRAPPED:
        assert not getattr(_stock(name), connector._MARK, False)  # one layer: the stock method underneath


def test_connector_has_the_attributes_the_hooks_read(eager_hpu: hpu.Backend) -> None:
    built = Trainer(accelerator="hpu", devices=2, logger=False)._accelerator_connector
    for name in connector.INSTANCE_ATTRIBUTES:
        assert hasattr(built, name), f"Lightning's {UPSTREAM} instances lost the attribute {name}"


def test_stock_strategy_choice_still_refuses_hpu(eager_hpu: hpu.Backend) -> None:
    built = Trainer(accelerator="hpu", devices=1, logger=False)._accelerator_connector
    assert built._accelerator_flag == "hpu"
    with pytest.raises(MisconfigurationException, match="HPU is currently not supported"):
        _stock("_choose_strategy")(built)


def test_stock_precision_choice_is_still_cuda_autocast(eager_hpu: hpu.Backend) -> None:
    built = Trainer(accelerator="hpu", devices=1, logger=False)._accelerator_connector
    built._precision_flag = "bf16-mixed"
    built._precision_plugin_flag = None
    plugin = _stock("_check_and_init_precision")(built)
    assert type(plugin) is MixedPrecision, f"{UPSTREAM}._check_and_init_precision changed what it builds"
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


def test_hpu_with_strategy_auto_gets_the_hpu_strategy(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", strategy="auto", devices=1, logger=False)
    assert type(trainer.strategy) is SingleHPUStrategy
    trainer = Trainer(accelerator="hpu", devices=2, precision="bf16-mixed", logger=False)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert isinstance(trainer.precision_plugin, HPUPrecision)


def test_auto_accelerator_is_hpu_when_one_is_available(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(devices=1, logger=False).strategy) is SingleHPUStrategy


def _uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in connector.WRAPPED:
        stock = _stock(name)
        original = staticmethod(stock) if name == "_choose_auto_accelerator" else stock
        monkeypatch.setattr(_AcceleratorConnector, name, original)
    assert not connector.installed()


def test_unsupported_lightning_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    with pytest.warns(UserWarning, match=r"pass `strategy='hpu_single'`"):
        assert connector.install() is False
    assert not connector.installed()


def test_connector_without_a_method_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.delattr(_AcceleratorConnector, "_validate_precision_choice")
    with pytest.warns(UserWarning, match="_validate_precision_choice"):
        assert connector.install() is False
    assert not connector.installed()


def test_moved_connector_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connector, "_MODULE", "lightning.pytorch.trainer.connectors.no_such_module")
    assert connector.connector_class() is None
    assert not connector.installed()
    with pytest.warns(UserWarning, match="no_such_module._AcceleratorConnector"):
        assert connector.install() is False


def test_hooks_reinstall_after_uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert connector.install() is True
    assert connector.installed()


def test_stock_connector_keeps_lightnings_ddp_under_hpu(eager_hpu: hpu.Backend) -> None:
    """Canary: Lightning itself still maps nothing; `strategy="ddp"` with HPUs builds its own CPU/GPU DDPStrategy."""
    built = Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, logger=False)._accelerator_connector
    built._strategy_flag = "ddp"
    _stock("_check_strategy_and_fallback")(built)
    assert built._strategy_flag == "ddp", f"{UPSTREAM}._check_strategy_and_fallback now changes 'ddp' under HPU"
    built._init_strategy()
    assert type(built.strategy) is DDPStrategy


def test_stock_auto_devices_are_every_device(eager_hpu: hpu.Backend) -> None:
    """Canary: 'auto' devices become the accelerator's device count (what the hpu_single hook narrows to one)."""
    built = Trainer(accelerator="hpu", strategy="hpu_single", devices=1, logger=False)._accelerator_connector
    built._devices_flag = "auto"
    _stock("_set_devices_flag_if_auto_passed")(built)
    assert built._devices_flag == eager_hpu.device_count()


def test_connector_runs_the_hooked_steps_in_the_order_the_hooks_rely_on() -> None:
    """Canary: devices resolve before the strategy flag is checked, and the flag is checked before it is built."""
    source = inspect.getsource(_AcceleratorConnector.__init__)
    steps = [
        "_set_parallel_devices_and_init_accelerator",
        "_choose_strategy",
        "_check_strategy_and_fallback",
        "_init_strategy",
        "_check_and_init_precision",
        "_lazy_init_strategy",
    ]
    positions = [source.find(f"self.{step}(") for step in steps]
    assert -1 not in positions, f"{UPSTREAM}.__init__ no longer calls {steps[positions.index(-1)]}"
    assert positions == sorted(positions), f"{UPSTREAM}.__init__ calls {steps} in another order now"
    source = inspect.getsource(_AcceleratorConnector._set_parallel_devices_and_init_accelerator)
    assert source.find("self._set_devices_flag_if_auto_passed()") < source.find("parse_devices"), (
        f"{UPSTREAM}._set_parallel_devices_and_init_accelerator no longer resolves 'auto' devices before parsing"
    )
