"""``fabric.no_backward_sync`` through a strategy's own control (``hpu_fast_ddp``): Fabric asks the strategy's private
``_backward_sync_control``; :func:`set_control` sets it on one instance where Fabric still asks."""

from __future__ import annotations

import inspect
from typing import Any

from lightning.fabric import Fabric
from lightning.fabric.strategies import Strategy

from lightning_gaudi.patches import registry

_ATTRIBUTE = "_backward_sync_control"
TARGETS = (
    "lightning.fabric.fabric.Fabric.no_backward_sync",
    "lightning.fabric.strategies.strategy._BackwardSyncControl",
)


def missing_targets() -> list[str]:
    """What the control relies on and this Lightning lacks (empty when everything is as checked)."""
    method = getattr(Fabric, "no_backward_sync", None)
    if not inspect.isfunction(method) or f"._strategy.{_ATTRIBUTE}" not in inspect.getsource(method):
        return [f"{TARGETS[0]} reading the strategy's {_ATTRIBUTE}"]
    return []


def set_control(strategy: Strategy, control: Any) -> bool:
    """Makes ``fabric.no_backward_sync`` call ``control.no_backward_sync(module, enabled)`` for ``strategy``; returns
    whether it does: not where this Fabric stopped asking (:func:`missing_targets`), which warns."""
    fallback = "hpu_fast_ddp's fabric.no_backward_sync all-reduces every backward; DDP works."
    if not registry.supported(missing_targets(), fallback):
        return False
    setattr(strategy, _ATTRIBUTE, control)
    return True
