"""The Fabric connector shim (``lightning_gaudi/patches/fabric_connector.py``) and the stock behaviour it replaces.

These tests fail loudly when Lightning changes what the wrappers rely on: a Fabric built with a recording policy must
call every hook and build what the hooks answer; a renamed ``_Connector`` method or attribute,
the order in which ``_Connector.__init__`` runs them, a version outside the checked range, or the stock behaviour
itself (Fabric choosing an HPU strategy or HPU autocast on its own, which would make a wrapper unnecessary).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.connector import _Connector
from lightning.fabric.plugins import MixedPrecision
from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUAccelerator, hpu
from lightning_gaudi.fabric import HPUParallelStrategy, HPUPrecision, SingleHPUStrategy
from lightning_gaudi.patches import fabric_connector, registry
from patches.test_connector import Recording as TrainerRecording

UPSTREAM = "lightning.fabric.connector._Connector"


def _stock(name: str) -> Any:
    return getattr(_Connector, name).__wrapped__


def _built(**kwargs: Any) -> Any:
    return Fabric(**kwargs)._connector


def test_installed_after_import() -> None:
    assert fabric_connector.installed()
    assert fabric_connector.PATCH.installed()
    assert fabric_connector.PATCH.targets == tuple(f"{UPSTREAM}.{name}" for name in fabric_connector.WRAPPED)


class Recording(TrainerRecording):
    def check_flags(self, strategy: Any, accelerator: Any, registered: Any) -> None:
        self.calls["check_flags"] = (strategy, accelerator, "ddp" in registered)


def test_a_fabric_is_built_through_every_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary: building a Fabric runs each wrapper, with the connector's flags, and builds what the policy answers."""
    chosen, plugin = SingleDeviceStrategy(device=torch.device("cpu")), MixedPrecision("bf16-mixed", "cpu")
    policy = Recording(strategy=chosen, precision=plugin)
    monkeypatch.setattr(fabric_connector.HOOKS, "policy", policy)
    fabric = Fabric(precision="bf16-mixed")  # accelerator, strategy and devices "auto"
    assert policy.calls == {
        "check_flags": ("auto", "auto", True),
        "auto_accelerator": (),
        "devices": ("cpu", "auto", "auto"),
        "choose_strategy": ("cpu", 1, 1),
        "check_strategy": ("cpu", chosen, 1),
        "precision": ("CPUAccelerator", "SingleDeviceStrategy", "bf16-mixed", None),
    }, f"{UPSTREAM} no longer runs the wrapped steps as the shim expects"
    assert fabric.strategy is chosen
    assert fabric.strategy.precision is plugin


def test_connector_methods_exist() -> None:
    for name in fabric_connector.CONNECTOR_ATTRIBUTES:
        assert callable(getattr(_Connector, name, None)), f"Lightning's {UPSTREAM} lost {name}"
    assert isinstance(_Connector.__dict__["_choose_auto_accelerator"], staticmethod), (
        f"{UPSTREAM}._choose_auto_accelerator is no longer a staticmethod"
    )


def test_hooks_are_installed_once() -> None:
    before = {name: _Connector.__dict__[name] for name in fabric_connector.WRAPPED}
    assert fabric_connector.install() is True
    assert before == {name: _Connector.__dict__[name] for name in fabric_connector.WRAPPED}
    for name in fabric_connector.WRAPPED:
        assert not getattr(_stock(name), fabric_connector.MARK, False)  # one layer: the stock method underneath


def test_connector_has_the_attributes_the_hooks_read(eager_hpu: hpu.Backend) -> None:
    built = _built(accelerator="hpu", devices=2)
    for name in fabric_connector.INSTANCE_ATTRIBUTES:
        assert hasattr(built, name), f"Lightning's {UPSTREAM} instances lost the attribute {name}"


def test_connector_runs_the_hooked_steps_in_the_order_the_hooks_rely_on() -> None:
    """Canary: flags are checked first; devices resolve before the strategy is chosen and checked, the strategy is
    built before the precision, and the strategy is completed (nodes, world ranks, launcher) last."""
    source = inspect.getsource(_Connector.__init__)
    steps = [
        "_check_config_and_set_final_flags",
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
    source = inspect.getsource(_Connector._set_parallel_devices_and_init_accelerator)
    assert source.find("self._set_devices_flag_if_auto_passed()") < source.find("parse_devices"), (
        f"{UPSTREAM}._set_parallel_devices_and_init_accelerator no longer resolves 'auto' devices before parsing"
    )
    source = inspect.getsource(_Connector._lazy_init_strategy)
    for step in ("self.strategy._set_world_ranks()", "_configure_launcher"):  # the HPU strategies check the launch
        assert step in source, f"{UPSTREAM}._lazy_init_strategy no longer runs {step!r}"


def test_stock_fabric_does_not_know_hpu(eager_hpu: hpu.Backend) -> None:
    """Canary: Lightning itself still picks CPU/CUDA classes for the HPU accelerator."""
    assert _stock("_choose_auto_accelerator")() != "hpu"
    built = _built(accelerator="hpu", devices=1)
    chosen = _stock("_choose_strategy")(built)
    assert type(chosen) is SingleDeviceStrategy
    assert chosen.root_device.type == "cpu"
    built = _built(accelerator="hpu", devices=2)
    assert _stock("_choose_strategy")(built) == "ddp"
    built._strategy_flag = "ddp"
    _stock("_check_strategy_and_fallback")(built)
    assert built._strategy_flag == "ddp", f"{UPSTREAM}._check_strategy_and_fallback now changes 'ddp' under HPU"
    built._precision_input = "bf16-mixed"
    built._precision_instance = None
    precision = _stock("_check_and_init_precision")(built)
    assert type(precision) is MixedPrecision
    assert precision.device == "cuda", "stock Fabric no longer autocasts bf16-mixed on CUDA for other accelerators"


def test_stock_auto_devices_are_every_device(eager_hpu: hpu.Backend) -> None:
    built = _built(accelerator="hpu", strategy="hpu_single")
    built._devices_flag = "auto"
    _stock("_set_devices_flag_if_auto_passed")(built)
    assert built._devices_flag == eager_hpu.device_count()


def test_stock_flag_check_refuses_unknown_names_without_naming_hpu_ones() -> None:
    built = _built(accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match="invalid strategy name") as error:
        _stock("_check_config_and_set_final_flags")(built, "hpu_paralel", "cpu", None, None)
    assert "hpu_parallel" not in str(error.value)


def test_hpu_with_strategy_auto_gets_the_hpu_classes(eager_hpu: hpu.Backend) -> None:
    assert type(Fabric(accelerator="hpu", devices=1).strategy) is SingleHPUStrategy
    fabric = Fabric(accelerator="hpu", devices=2, precision="bf16-mixed")
    assert type(fabric.strategy) is HPUParallelStrategy
    assert isinstance(fabric.strategy.precision, HPUPrecision)


def test_auto_accelerator_is_hpu_when_one_is_available(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(devices=1)
    assert isinstance(fabric.accelerator, HPUAccelerator)
    assert type(fabric.strategy) is SingleHPUStrategy


def test_other_accelerators_are_left_alone(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="cpu", devices=2)
    assert type(fabric.strategy) is DDPStrategy
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    assert type(fabric.strategy) is SingleDeviceStrategy
    assert type(fabric.strategy.precision) is MixedPrecision
    assert fabric.strategy.precision.device == "cpu"


def _uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in fabric_connector.WRAPPED:
        stock = _stock(name)
        original = staticmethod(stock) if name == "_choose_auto_accelerator" else stock
        monkeypatch.setattr(_Connector, name, original)
    assert not fabric_connector.installed()


def test_unsupported_lightning_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    with pytest.warns(UserWarning, match=r"pass `strategy='hpu_single'`.*HPUPrecision"):
        assert fabric_connector.install() is False
    assert not fabric_connector.installed()


def test_connector_without_a_method_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    monkeypatch.delattr(_Connector, "_lazy_init_strategy")
    with pytest.warns(UserWarning, match="_lazy_init_strategy"):
        assert fabric_connector.install() is False
    assert not fabric_connector.installed()


def test_moved_connector_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabric_connector, "_MODULE", "lightning.fabric.no_such_module")
    assert fabric_connector.connector_class() is None
    assert not fabric_connector.installed()
    with pytest.warns(UserWarning, match="no_such_module._Connector"):
        assert fabric_connector.install() is False


def test_hooks_reinstall_after_uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fabric_connector.install() is True
    assert fabric_connector.installed()
