"""Lightning Fabric on Intel Gaudi HPUs: Fabric's HPU strategies and precision plugins, registered by
``import lightning_gaudi`` (``Fabric(accelerator="hpu", strategy="hpu_parallel", devices=8)``)."""

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
from lightning_gaudi.patches import fabric_compile, fabric_launch_hint

__all__ = [
    "RUN_COMMAND",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "HPUPrecision",
    "SingleHPUStrategy",
    "check_precision_plugin",
    "compile_backend_for",
    "launch_hint",
    "register",
]

#: The command that starts a Fabric script on several HPUs, as Lightning's ``fabric run`` does on GPUs
#: (:mod:`lightning_gaudi.fabric_run`).
RUN_COMMAND = "python -m lightning_gaudi fabric run"


def compile_backend_for(strategy: Any) -> Any:
    """The ``torch.compile`` backend ``fabric.setup`` recompiles a model with on an HPU strategy (else ``None``)."""
    return strategy.compile_backend() if isinstance(strategy, FabricCore) else None


def launch_hint(fabric: Any) -> str | None:
    """What Fabric's refusal of an unlaunched multi-device job adds on an HPU strategy: the command that starts it."""
    strategy = fabric.strategy
    if not isinstance(strategy, FabricCore):
        return None
    devices = len(getattr(strategy, "parallel_devices", None) or ()) or 1
    nodes = getattr(strategy, "num_nodes", 1)
    layout = f"--devices {devices}" + (f" --num-nodes {nodes} --node-rank R --main-address HOST" if nodes > 1 else "")
    return (
        f"On the HPU, Lightning's `fabric run` has no HPU accelerator: start the script with `{RUN_COMMAND}"
        f" --accelerator hpu {layout} SCRIPT [ARGS...]` (see `{RUN_COMMAND} --help`), or call `fabric.launch()`."
    )


def register() -> None:
    """Registers ``"hpu"`` and the HPU strategies with Fabric's registries (idempotent)."""
    HPUAccelerator.register_accelerators(ACCELERATOR_REGISTRY)
    for strategy in (SingleHPUStrategy, HPUParallelStrategy, HPUFSDPStrategy, HPUModelParallelStrategy):
        strategy.register_strategies(STRATEGY_REGISTRY)
    fabric_compile.HOOKS.backend = compile_backend_for
    fabric_launch_hint.HOOKS.hint = launch_hint
