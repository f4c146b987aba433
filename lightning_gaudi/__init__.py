"""Train on Intel Gaudi HPUs with PyTorch Lightning 2.6.

Importing it registers the ``"hpu"`` accelerator and the HPU strategies with the Trainer and Fabric, so
``Trainer(accelerator="hpu", strategy="hpu_parallel")`` works by name. :func:`configure` applies the HPU runtime
settings before the bridge loads.
"""

from __future__ import annotations

# `python -m lightning_gaudi.doctor ARGS` imports this package first: its --help and bad arguments are answered here,
# before torch and Lightning load (seconds); any other import returns at once. The imports below follow it (E402).
from lightning_gaudi.doctor.options import answer_early

answer_early()

import logging

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from lightning_gaudi import fabric, patches, routing
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.fsdp_precision import HPUFSDPPrecision
from lightning_gaudi.hpu.runtime import RecipeCache, Runtime, configure
from lightning_gaudi.optimizers import fuse_optimizer
from lightning_gaudi.precision import HPUPrecision
from lightning_gaudi.strategies import (
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
)

__version__ = "0.1.0"

__all__ = [
    "HPUAccelerator",
    "HPUCheckpointIO",
    "HPUDeepSpeedStrategy",
    "HPUFSDPPrecision",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "HPUPrecision",
    "RecipeCache",
    "Runtime",
    "SingleHPUStrategy",
    "configure",
    "fuse_optimizer",
    "register",
]

_log = logging.getLogger(__name__)
if not _log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    _log.addHandler(_handler)
    _log.propagate = False


def register() -> None:
    """Registers the HPU accelerator and strategies with the Trainer and Fabric and installs the patches (with the
    routing policy); runs at import, safe to call again."""
    HPUAccelerator.register_accelerators(AcceleratorRegistry)
    SingleHPUStrategy.register_strategies(StrategyRegistry)
    HPUParallelStrategy.register_strategies(StrategyRegistry)
    HPUDeepSpeedStrategy.register_strategies(StrategyRegistry)
    HPUFSDPStrategy.register_strategies(StrategyRegistry)
    HPUModelParallelStrategy.register_strategies(StrategyRegistry)
    fabric.register()
    routing.install()
    patches.install_all()


register()
