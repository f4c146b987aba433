"""Everything in lightning_gaudi that touches Lightning's or torch's private internals.

Each module patches (or relies on) one upstream target and describes itself with a
:class:`~lightning_gaudi.patches.registry.Patch` in :data:`PATCHES`:

- ``connector``: HPU strategy/precision choices in Lightning's accelerator connector;
- ``sync_free_logging``: progress-bar values kept on the device until the bar refreshes;
- ``loops``: evaluation under ``torch.no_grad`` for one trainer (:func:`~.loops.disable_inference_mode`);
- ``lr_scheduler``: a torch LR scheduler moved to a replacement optimizer (:func:`~.lr_scheduler.rebind_scheduler`);
- ``precision_plugin``: a method overridden on one live precision plugin (:func:`~.precision_plugin.override_method`);
- ``amp_unscaling``: which optimizers Lightning's fp16 plugin leaves scaled until their step
  (:func:`~.amp_unscaling.unscales_in_step`);
- ``sync_batchnorm``: synchronized batch norm under eager emulation, built on torch's batch norm base class
  (:func:`~.sync_batchnorm.convert`);
- ``device_info``: an "HPU available" line (what runs, the cards used, the strategy) beside Lightning's GPU and TPU
  lines when a Trainer is built;
- ``logging_cadence``: when Lightning writes a training batch's logged metrics, and at which step
  (:func:`~.logging_cadence.train_log_step`);
- ``tuner_oom``: HPU out-of-memory errors recognised by Lightning's batch-size search;
- ``fabric_connector``: HPU strategy/precision choices in Lightning Fabric's connector, and the launch checked while
  Fabric is built;
- ``fp8_precision_name``: ``precision="fp8"`` through Lightning's precision-name check, routed to the HPU FP8 plugins
  (other accelerators refused with the fix);
- ``signals``: SIGTERM during fit handled by :class:`~lightning_gaudi.callbacks.PreemptionCheckpoint` instead of
  Lightning's signal connector, without Lightning's per-batch broadcast (:func:`~.signals.take_over_sigterm`);
- ``deepspeed_strategy``: the steps of Lightning's CUDA-only ``DeepSpeedStrategy`` that
  :class:`~lightning_gaudi.strategies.HPUDeepSpeedStrategy` replaces (:func:`~.deepspeed_strategy.initialize_engine`).

``import lightning_gaudi`` calls :func:`install_all`. On a Lightning (or torch) outside the checked range nothing is
patched and a warning says what still works; ``tests/patches/`` holds one canary per module that fails, naming the
upstream code, when an upgrade changes what a patch relies on.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_gaudi.patches import (
    amp_unscaling,
    connector,
    deepspeed_strategy,
    device_info,
    fabric_connector,
    fp8_precision_name,
    logging_cadence,
    loops,
    lr_scheduler,
    precision_plugin,
    signals,
    sync_batchnorm,
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
            loops.PATCH,
            lr_scheduler.PATCH,
            precision_plugin.PATCH,
            amp_unscaling.PATCH,
            sync_batchnorm.PATCH,
            device_info.PATCH,
            logging_cadence.PATCH,
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
