"""Fabric's routing policy (:mod:`.common`)."""

from __future__ import annotations

from lightning.fabric.strategies import STRATEGY_REGISTRY, SingleDeviceStrategy, Strategy
from lightning.pytorch.strategies import Strategy as TrainerStrategy

from lightning_gaudi.fabric import (
    HPUFP8Precision,
    HPUParallelStrategy,
    HPUPrecision,
    SingleHPUStrategy,
    check_precision_plugin,
)
from lightning_gaudi.routing.common import Routing

FABRIC = Routing(
    owner="Fabric",
    package="lightning_gaudi.fabric",
    registry=STRATEGY_REGISTRY,
    strategy_base=Strategy,
    lightning_single=SingleDeviceStrategy,
    single_hpu=SingleHPUStrategy,
    parallel_hpu=HPUParallelStrategy,
    mixed_precision=HPUPrecision,
    check_plugin=check_precision_plugin,
    fp8_plugin=lambda strategy: HPUFP8Precision(),
    other_base=TrainerStrategy,
)
