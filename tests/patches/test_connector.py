"""The accelerator-connector patch (``lightning_gaudi/patches/connector.py``) and the stock behaviour it replaces.

These tests fail loudly when Lightning changes what the wrappers rely on: a renamed connector method or attribute,
a new version outside the checked range, or a change in the stock behaviour (for instance Lightning choosing an
HPU strategy on its own again, which would make a wrapper unnecessary).
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

from lightning_gaudi import HPUAccelerator, HPUCheckpointIO, HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu
from lightning_gaudi.patches import connector, registry

UPSTREAM = "lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector"


def _stock(name: str) -> Any:
    return getattr(_AcceleratorConnector, name).__wrapped__


def test_installed_after_import() -> None:
    assert connector.installed()
    assert connector.PATCH.installed()


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


# ----------------------------------------------------------------------------------------------------------------------
# Lightning's strategy names and instances under accelerator="hpu"
# ----------------------------------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ddp", {"start_method": "popen", "find_unused_parameters": False}),
        ("ddp_spawn", {"start_method": "spawn", "find_unused_parameters": False}),
        ("ddp_find_unused_parameters_true", {"start_method": "popen", "find_unused_parameters": True}),
        ("ddp_find_unused_parameters_false", {"start_method": "popen", "find_unused_parameters": False}),
        ("ddp_spawn_find_unused_parameters_true", {"start_method": "spawn", "find_unused_parameters": True}),
        ("DDP", {"start_method": "popen", "find_unused_parameters": False}),  # Lightning lower-cases names
    ],
)
def test_lightning_ddp_names_run_the_hpu_strategy(eager_hpu: hpu.Backend, name: str, expected: dict[str, Any]) -> None:
    trainer = Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUParallelStrategy
    assert strategy._start_method == expected["start_method"]
    assert strategy.ddp_kwargs["find_unused_parameters"] is expected["find_unused_parameters"]
    assert strategy.ddp_kwargs["gradient_as_bucket_view"] is True  # the HPU strategy's defaults, not Lightning's
    assert strategy._get_process_group_backend() == "gloo"
    assert isinstance(strategy.checkpoint_io, HPUCheckpointIO)


def test_lightning_ddp_name_under_auto_accelerator(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(strategy="ddp", devices=2, logger=False).strategy) is HPUParallelStrategy


def test_lightning_single_device_name_runs_the_hpu_strategy(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(accelerator="hpu", strategy="single_device", devices=1, logger=False).strategy) is (
        SingleHPUStrategy
    )


@pytest.mark.parametrize(
    "name",
    ["ddp_fork", "ddp_notebook", "ddp_fork_find_unused_parameters_true", "ddp_notebook_find_unused_parameters_false"],
)
def test_forking_ddp_names_are_refused_naming_the_hpu_ones(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` forks.*'hpu_parallel'.*'hpu_parallel_spawn'"):
        Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)


@pytest.mark.parametrize("name", ["xla", "xla_debug"])
def test_other_lightning_strategies_are_refused_naming_the_hpu_ones(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` .* does not run on HPUs.*'hpu_parallel'"):
        Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)


def test_lightning_ddp_name_in_lazy_emulation_is_refused_as_hpu_parallel(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="'hpu_parallel' cannot run under LIGHTNING_GAUDI_EMULATE=lazy"):
        Trainer(accelerator="hpu", strategy="ddp", devices=1, logger=False)


def test_lightning_ddp_instance_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"DDPStrategy.*does not run on HPUs.*HPUParallelStrategy\(\.\.\.\)"):
        Trainer(accelerator="hpu", strategy=DDPStrategy(find_unused_parameters=True), devices=2, logger=False)
    with pytest.raises(ValueError, match=r"DDPStrategy.*does not run on HPUs.*HPUParallelStrategy"):
        Trainer(strategy=DDPStrategy(accelerator=HPUAccelerator()), devices=2, logger=False)


def test_a_ddp_subclass_instance_is_refused(eager_hpu: hpu.Backend) -> None:
    class MyDDP(DDPStrategy):
        pass

    with pytest.raises(
        ValueError,
        match=r"MyDDP.*does not run on HPUs.*subclass lightning_gaudi's HPUParallelStrategy instead of DDPStrategy",
    ):
        Trainer(accelerator="hpu", strategy=MyDDP(), devices=2, logger=False)


def test_lightning_single_device_instance_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"SingleDeviceStrategy.*does not run on HPUs.*SingleHPUStrategy"):
        Trainer(accelerator="hpu", strategy=SingleDeviceStrategy(device="cpu"), devices=1, logger=False)


def test_lightning_ddp_is_left_alone_on_other_accelerators(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False).strategy) is DDPStrategy
    assert type(Trainer(accelerator="cpu", strategy=DDPStrategy(), devices=2, logger=False).strategy) is DDPStrategy


@pytest.mark.parametrize(
    ("strategy", "devices", "num_nodes"),
    [("hpu_single", 2, 1), ("hpu_single", "0,1", 1), ("single_device", 2, 1), ("hpu_single", 1, 2), (None, 2, 1)],
)
def test_single_hpu_strategy_with_several_devices_is_refused(
    eager_hpu: hpu.Backend, strategy: str | None, devices: Any, num_nodes: int
) -> None:
    with pytest.raises(ValueError, match=r"trains on one HPU, but the Trainer asks for .*strategy='hpu_parallel'"):
        Trainer(
            accelerator="hpu",
            strategy=SingleHPUStrategy() if strategy is None else strategy,
            devices=devices,
            num_nodes=num_nodes,
            logger=False,
        )


def test_single_hpu_strategy_with_auto_devices_takes_one(eager_hpu: hpu.Backend) -> None:
    assert eager_hpu.device_count() > 1
    trainer = Trainer(accelerator="hpu", strategy="hpu_single", logger=False)  # devices="auto"
    assert type(trainer.strategy) is SingleHPUStrategy
    assert trainer.num_devices == 1
    trainer = Trainer(accelerator="hpu", logger=False)  # strategy and devices "auto": every card, in parallel
    assert type(trainer.strategy) is HPUParallelStrategy
    assert trainer.num_devices == eager_hpu.device_count()
