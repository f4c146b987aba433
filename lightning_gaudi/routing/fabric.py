"""Fabric's routing policy (:mod:`.common`), plus checks of the strategy flag and of the launch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning.fabric.strategies import STRATEGY_REGISTRY, SingleDeviceStrategy, Strategy
from lightning.pytorch.strategies import Strategy as TrainerStrategy
from typing_extensions import override

from lightning_gaudi.fabric import (
    HPUFP8Precision,
    HPUParallelStrategy,
    HPUPrecision,
    SingleHPUStrategy,
    check_precision_plugin,
)
from lightning_gaudi.routing.common import Routing


@dataclass(frozen=True)
class FabricRouting(Routing):
    """:class:`~.common.Routing` for Fabric: a Trainer strategy of ``lightning_gaudi`` is refused (its Fabric twin
    named)."""

    @override
    def check_flags(self, strategy: Any, accelerator: Any, registered: Sequence[str]) -> None:
        """:meth:`Routing.check_flags`; a Trainer strategy of ``lightning_gaudi`` is refused naming its Fabric twin."""
        super().check_flags(strategy, accelerator, registered)
        if isinstance(strategy, TrainerStrategy) and type(strategy).__module__.startswith("lightning_gaudi."):
            cls = type(strategy).__name__
            raise ValueError(
                f"`strategy={cls}(...)`: lightning_gaudi.{cls} is the Trainer's strategy. With Fabric use"
                f" lightning_gaudi.fabric.{cls}(...), which takes the same arguments (`precision` where the Trainer's"
                f" takes `precision_plugin`), or its name, {type(strategy).strategy_name!r}."  # type: ignore[attr-defined]
            )


FABRIC = FabricRouting(
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
)
