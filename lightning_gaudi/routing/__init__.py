"""Which HPU strategy or precision plugin answers a Lightning name, for the Trainer and Fabric; :func:`install` hands
the policies to the connector shims of :mod:`lightning_gaudi.patches`."""

from __future__ import annotations

from lightning_gaudi.patches import connector, fabric_connector
from lightning_gaudi.routing.fabric import FABRIC
from lightning_gaudi.routing.trainer import TRAINER

__all__ = ["FABRIC", "TRAINER", "install"]


def install() -> None:
    """Gives the connector shims their routing policies (idempotent)."""
    connector.HOOKS.policy = TRAINER
    fabric_connector.HOOKS.policy = FABRIC
