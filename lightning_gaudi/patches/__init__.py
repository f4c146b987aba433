"""Shims of Lightning's and torch's private internals: the bottom layer of lightning_gaudi.

A shim imports nothing of the package above it (only :mod:`lightning_gaudi.hpu` and other shims); policy comes in as
hooks (the connector shims call the routing policy :mod:`lightning_gaudi.routing` sets). Emulator-only code lives in
:mod:`lightning_gaudi.emulation`, the readers of torch.compile's records in :mod:`lightning_gaudi.callbacks.dynamo`.
Each module patches (or relies on) one upstream target and describes itself with a
:class:`~lightning_gaudi.patches.registry.Patch` in :data:`PATCHES`:

- ``connector``: Lightning's accelerator connector, asking the routing policy first;
- ``sync_free_logging``: progress-bar values kept on the device until the bar refreshes;
- ``tuner_oom``: HPU out-of-memory errors recognised by Lightning's batch-size search;
- ``fabric_connector``: Lightning Fabric's connector, asking the routing policy first;
- ``fp8_precision_name``: ``precision="fp8"`` through Lightning's precision-name check (the policy routes it);
- ``signals``: SIGTERM during fit handled by :class:`~lightning_gaudi.callbacks.PreemptionCheckpoint` instead of
  Lightning's signal connector, without Lightning's per-batch broadcast (:func:`~.signals.take_over_sigterm`);
- ``deepspeed_strategy``: the steps of Lightning's CUDA-only ``DeepSpeedStrategy`` that
  :class:`~lightning_gaudi.strategies.HPUDeepSpeedStrategy` replaces (:func:`~.deepspeed_strategy.check_installed`).

``import lightning_gaudi`` calls :func:`install_all`. On a Lightning (or torch) outside the checked range nothing is
patched and a warning says what still works; ``tests/patches/`` holds one canary per module that fails, naming the
upstream code, when an upgrade changes what a patch relies on.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_gaudi.patches import (
    connector,
    deepspeed_strategy,
    fabric_connector,
    fp8_precision_name,
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
            fp8_precision_name.PATCH,
            signals.PATCH,
            deepspeed_strategy.PATCH,
        )
    }
)


def install_all() -> dict[str, bool]:
    """Installs every patch (idempotent): what ``import lightning_gaudi`` runs.

    Returns:
        Whether each patch is in effect, by name; a patch that is not warned why when it was tried.
    """
    return {name: patch.install() for name, patch in PATCHES.items()}


def installed() -> dict[str, bool]:
    """Whether each patch is in effect, by name."""
    return {name: patch.installed() for name, patch in PATCHES.items()}
