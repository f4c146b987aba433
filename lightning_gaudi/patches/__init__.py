"""Shims of Lightning's and torch's private internals, one target each, policy coming in as hooks; each one installed
at import has its :class:`~lightning_gaudi.patches.registry.Patch` in :data:`PATCHES`, the others check upstream where
they are used; their canaries are in ``tests/patches/``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_gaudi.patches import (
    connector,
    fabric_compile,
    fabric_connector,
    fabric_launch_hint,
    fp8_precision_name,
    launcher,
    no_grad_eval,
    sharded_tensor_device,
    signals,
    sync_free_logging,
    tuner_oom,
)
from lightning_gaudi.patches.registry import SUPPORTED_LIGHTNING, SUPPORTED_TORCH, Patch

__all__ = ["PATCHES", "SUPPORTED_LIGHTNING", "SUPPORTED_TORCH", "Patch", "install_all", "installed"]

#: Every patch, by name, in installation order.
PATCHES: Mapping[str, Patch] = MappingProxyType(
    {
        patch.name: patch
        for patch in (
            connector.PATCH,
            sync_free_logging.PATCH,
            tuner_oom.PATCH,
            fabric_connector.PATCH,
            fabric_compile.PATCH,
            fp8_precision_name.PATCH,
            signals.PATCH,
            fabric_launch_hint.PATCH,
            launcher.PATCH,
            sharded_tensor_device.PATCH,
            no_grad_eval.PATCH,
        )
    }
)


def install_all() -> dict[str, bool]:
    """Installs every patch (idempotent; ``import lightning_gaudi`` runs it); returns whether each is in effect."""
    return {name: patch.install() for name, patch in PATCHES.items()}


def installed() -> dict[str, bool]:
    """Whether each patch is in effect, by name."""
    return {name: patch.installed() for name, patch in PATCHES.items()}
