"""Lightning Fabric on Intel Gaudi HPUs.

``import lightning_gaudi`` registers the ``"hpu"`` accelerator and the HPU strategies with Fabric's registries as
well as the Trainer's, so a Fabric loop moves to Gaudi by changing the accelerator::

    fabric = Fabric(accelerator="hpu", strategy="hpu_parallel", devices=8, precision="bf16-mixed")

Fabric has strategy classes of its own; these are the HPU ones, sharing their HPU work with the Trainer's:
:class:`SingleHPUStrategy`, :class:`HPUParallelStrategy`, :class:`HPUFSDPStrategy` (sharded ``fabric.save``/``load``),
:class:`HPUModelParallelStrategy` (FSDP2 and tensor parallelism), :class:`HPUPrecision` and :class:`HPUFP8Precision`
(``precision="fp8"``, Gaudi 2 and later, emulated on the CPU). With ``accelerator="hpu"``, Fabric's
``strategy="auto"`` and precision strings pick them (:mod:`lightning_gaudi.patches.fabric_connector`).
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.strategies import STRATEGY_REGISTRY

from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.fabric._base import FabricCore
from lightning_gaudi.fabric.fp8 import HPUFP8Precision
from lightning_gaudi.fabric.fsdp import HPUFSDPPrecision, HPUFSDPStrategy
from lightning_gaudi.fabric.model_parallel import HPUModelParallelStrategy
from lightning_gaudi.fabric.parallel import HPUParallelStrategy
from lightning_gaudi.fabric.precision import HPUPrecision, check_precision_plugin
from lightning_gaudi.fabric.single import SingleHPUStrategy
from lightning_gaudi.patches import fabric_compile

__all__ = [
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "HPUPrecision",
    "SingleHPUStrategy",
    "check_precision_plugin",
    "compile_backend_for",
    "register",
]


def compile_backend_for(strategy: Any) -> str | None:
    """The ``torch.compile`` backend ``fabric.setup`` recompiles a model with on ``strategy``: the execution mode's on
    an HPU strategy (:meth:`FabricCore.compile_backend`), ``None`` (torch's default) on any other."""
    return strategy.compile_backend() if isinstance(strategy, FabricCore) else None


def register() -> None:
    """Registers ``"hpu"`` and the HPU strategies with Fabric's registries (``import lightning_gaudi`` does; again is
    harmless)."""
    HPUAccelerator.register_accelerators(ACCELERATOR_REGISTRY)
    SingleHPUStrategy.register_strategies(STRATEGY_REGISTRY)
    HPUParallelStrategy.register_strategies(STRATEGY_REGISTRY)
    HPUFSDPStrategy.register_strategies(STRATEGY_REGISTRY)
    HPUModelParallelStrategy.register_strategies(STRATEGY_REGISTRY)
    fabric_compile.HOOKS.backend = compile_backend_for
