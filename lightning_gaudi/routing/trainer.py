"""The Trainer's routing policy (:mod:`.common`)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import (
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
    StrategyRegistry,
)

from lightning_gaudi.fp8 import HPUFP8Precision
from lightning_gaudi.precision import HPUPrecision, check_precision_supported
from lightning_gaudi.routing.common import Routing
from lightning_gaudi.strategies import HPUParallelStrategy, SingleHPUStrategy


def fp8_plugin(strategy: Any) -> HPUFP8Precision:
    """The Trainer's plugin for ``precision="fp8"``; raises ``ValueError`` under a strategy that shards the model."""
    if isinstance(strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)):
        raise ValueError(
            f"`precision='fp8'` is not supported with {type(strategy).__name__}: the FP8 layers and their scaling"
            " state are not sharded. Train FP8 with strategy='hpu_parallel' (or 'hpu_single'), or keep the sharded"
            " strategy with precision='bf16-mixed'."
        )
    return HPUFP8Precision()


TRAINER = Routing(
    owner="Trainer",
    package="lightning_gaudi",
    registry=StrategyRegistry,
    strategy_base=Strategy,
    lightning_single=SingleDeviceStrategy,
    single_hpu=SingleHPUStrategy,
    parallel_hpu=HPUParallelStrategy,
    mixed_precision=HPUPrecision,
    check_plugin=check_precision_supported,
    fp8_plugin=fp8_plugin,
)
