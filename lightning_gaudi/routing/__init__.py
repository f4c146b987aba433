"""Routing: which HPU strategy or precision plugin answers a Lightning name, for the Trainer and for Fabric.

This layer sits above the strategies, Fabric's classes and the precision plugins, and below nothing but the package's
entry point. Lightning's connectors are wrapped by shims in :mod:`lightning_gaudi.patches` (:mod:`~.patches.connector`,
:mod:`~.patches.fabric_connector`, :mod:`~.patches.fp8_precision_name`) that know Lightning's private names and no
policy; :func:`install` gives them the policies of :mod:`.trainer` and :mod:`.fabric`, both built on :mod:`.common`.
"""

from __future__ import annotations

from lightning_gaudi.patches import connector, fabric_connector
from lightning_gaudi.routing.fabric import FABRIC
from lightning_gaudi.routing.trainer import TRAINER

__all__ = ["FABRIC", "TRAINER", "install"]


def install() -> None:
    """Gives the connector shims their routing policies (idempotent); ``patches.install_all()`` puts the shims in
    place."""
    connector.HOOKS.policy = TRAINER
    fabric_connector.HOOKS.policy = FABRIC
