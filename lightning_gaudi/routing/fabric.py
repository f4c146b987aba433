"""Fabric's routing policy (:mod:`.common`), plus checks of the strategy flag and of the launch."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning.fabric.strategies import STRATEGY_REGISTRY, SingleDeviceStrategy, Strategy
from lightning.pytorch.strategies import Strategy as TrainerStrategy

from lightning_gaudi.fabric import (
    HPUFP8Precision,
    HPUParallelStrategy,
    HPUPrecision,
    SingleHPUStrategy,
    check_precision_plugin,
)
from lightning_gaudi.routing.common import Routing, is_hpu, is_hpu_strategy_class


@dataclass(frozen=True)
class FabricRouting(Routing):
    """:class:`~.common.Routing` with Fabric's two more questions (``FabricConnectorPolicy``)."""

    def check_flags(self, strategy: Any, accelerator: Any, registered: Sequence[str]) -> None:
        """Raises ``ValueError`` with the fix for an unknown ``"hpu..."`` name (any unknown name with
        ``accelerator="hpu"``) or a Trainer strategy of ``lightning_gaudi``."""
        if isinstance(strategy, str):
            name = strategy.lower()
            if name == "auto" or name in registered or not (name.startswith("hpu") or is_hpu(accelerator)):
                return
            names = [
                n
                for n in self.registry.available_strategies()
                if is_hpu_strategy_class(self.registered_class(n) or object)
            ]
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"`strategy={strategy!r}` is not a strategy Fabric knows. The HPU strategies are"
                f" {', '.join(repr(n) for n in names)} (or an instance of lightning_gaudi.fabric.SingleHPUStrategy or"
                f" HPUParallelStrategy).{hint}"
            )
        if isinstance(strategy, TrainerStrategy) and type(strategy).__module__.startswith("lightning_gaudi."):
            cls = type(strategy).__name__
            raise ValueError(
                f"`strategy={cls}(...)`: lightning_gaudi.{cls} is the Trainer's strategy. With Fabric use"
                f" lightning_gaudi.fabric.{cls}(...), which takes the same arguments (`precision` where the Trainer's"
                f" takes `precision_plugin`), or its name, {type(strategy).strategy_name!r}."  # type: ignore[attr-defined]
            )

    def strategy_built(self, strategy: Any) -> None:
        """Checks an ``HPUParallelStrategy``'s launch before any process starts."""
        if isinstance(strategy, HPUParallelStrategy):
            strategy.check_launch()


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
