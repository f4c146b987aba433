"""HPU training strategies."""

from lightning_gaudi.strategies.deepspeed import HPUDeepSpeedStrategy
from lightning_gaudi.strategies.fsdp import HPUFSDPStrategy
from lightning_gaudi.strategies.layer_sync import HPUSyncBatchNorm
from lightning_gaudi.strategies.model_parallel import HPUModelParallelStrategy
from lightning_gaudi.strategies.parallel import HPUParallelStrategy
from lightning_gaudi.strategies.single import SingleHPUStrategy

__all__ = [
    "HPUDeepSpeedStrategy",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "HPUSyncBatchNorm",
    "SingleHPUStrategy",
]
