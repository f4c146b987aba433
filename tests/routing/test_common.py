"""The protocol between HPU strategies and the connectors (``lightning_gaudi/routing/common.py``):
``lightning_counterparts`` maps Lightning's names and refuses Lightning's instances; ``hpu_precision_plugin`` lets the
strategy choose the precision plugin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from lightning.fabric import Fabric
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.fabric.strategies import XLAStrategy as FabricXLAStrategy
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, Strategy, StrategyRegistry, XLAStrategy

from lightning_gaudi import HPUParallelStrategy, HPUPrecision, hpu
from lightning_gaudi import fabric as hpu_fabric
from lightning_gaudi.routing import common


class _Chosen(Precision):
    pass


class HPUXLAStandIn(HPUParallelStrategy):
    """A stand-in for Lightning's XLA strategy (a class no real HPU strategy claims), to exercise the protocol."""

    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (XLAStrategy,)
    chosen: ClassVar[Precision | None] = None

    def __init__(self, debug: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.debug = debug

    def hpu_precision_plugin(self, precision: str) -> Precision | None:
        return self.chosen if precision == "bf16-mixed" else None


class FabricHPUXLAStandIn(hpu_fabric.HPUParallelStrategy):
    lightning_counterparts: ClassVar[tuple[type[Any], ...]] = (FabricXLAStrategy,)

    def __init__(self, debug: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.debug = debug


@pytest.fixture
def stand_in(eager_hpu: hpu.Backend) -> Iterator[type[HPUXLAStandIn]]:
    StrategyRegistry.register("hpu_xla_stand_in", HPUXLAStandIn)
    STRATEGY_REGISTRY.register("hpu_xla_stand_in", FabricHPUXLAStandIn)
    HPUXLAStandIn.chosen = None
    yield HPUXLAStandIn
    del StrategyRegistry["hpu_xla_stand_in"]
    del STRATEGY_REGISTRY["hpu_xla_stand_in"]


def test_a_claimed_lightning_name_builds_the_hpu_class_with_the_registry_arguments(
    stand_in: type[HPUXLAStandIn], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO"):
        strategy = Trainer(accelerator="hpu", strategy="xla_debug", devices=2, logger=False).strategy
    assert type(strategy) is stand_in
    assert strategy.debug is True
    assert "`strategy='xla_debug'` with accelerator='hpu': training with HPUXLAStandIn(debug=True)" in caplog.text
    assert type(Fabric(accelerator="hpu", strategy="xla", devices=2).strategy) is FabricHPUXLAStandIn


def test_an_unclaimed_lightning_name_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`strategy='xla_debug'` \(XLAStrategy\) does not run on HPUs.*hpu_parallel"):
        Trainer(accelerator="hpu", strategy="xla_debug", devices=2, logger=False)


def test_an_inherited_declaration_claims_nothing(eager_hpu: hpu.Backend) -> None:
    class MyHPUDDP(HPUParallelStrategy):
        pass

    StrategyRegistry.register("my_hpu_ddp", MyHPUDDP)
    try:
        assert common.hpu_counterpart(DDPStrategy, StrategyRegistry) is HPUParallelStrategy
        assert common.claimed_counterparts(MyHPUDDP) == ()
        assert common.is_hpu_strategy_class(MyHPUDDP)
        assert type(Trainer(accelerator="hpu", strategy="ddp", devices=2, logger=False).strategy) is (
            HPUParallelStrategy
        )
        # the user's subclass of an HPU strategy is no Lightning instance to refuse
        assert type(Trainer(accelerator="hpu", strategy=MyHPUDDP(), devices=2, logger=False).strategy) is MyHPUDDP
    finally:
        del StrategyRegistry["my_hpu_ddp"]


def test_the_strategy_chooses_the_precision_plugin(stand_in: type[HPUXLAStandIn]) -> None:
    stand_in.chosen = _Chosen()
    trainer = Trainer(accelerator="hpu", strategy="hpu_xla_stand_in", devices=2, precision="bf16-mixed", logger=False)
    assert trainer.precision_plugin is stand_in.chosen


def test_a_strategy_leaving_the_precision_to_the_connector_gets_hpu_autocast(stand_in: type[HPUXLAStandIn]) -> None:
    stand_in.chosen = None
    trainer = Trainer(accelerator="hpu", strategy="hpu_xla_stand_in", devices=2, precision="bf16-mixed", logger=False)
    assert type(trainer.precision_plugin) is HPUPrecision


def test_a_given_precision_plugin_is_not_replaced_by_the_strategy(stand_in: type[HPUXLAStandIn]) -> None:
    stand_in.chosen = _Chosen()
    given = HPUPrecision("bf16-mixed")
    trainer = Trainer(accelerator="hpu", strategy="hpu_xla_stand_in", devices=2, plugins=[given], logger=False)
    assert trainer.precision_plugin is given


def test_the_precision_is_checked_before_the_strategy_is_asked(stand_in: type[HPUXLAStandIn]) -> None:
    stand_in.chosen = _Chosen()
    with pytest.raises(ValueError, match="64-true"):
        Trainer(accelerator="hpu", strategy="hpu_xla_stand_in", devices=2, precision="64-true", logger=False)
