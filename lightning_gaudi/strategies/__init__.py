"""HPU training strategies."""

from lightning_gaudi.strategies.layer_sync import HPUSyncBatchNorm
from lightning_gaudi.strategies.parallel import HPUParallelStrategy
from lightning_gaudi.strategies.single import SingleHPUStrategy

__all__ = ["HPUParallelStrategy", "HPUSyncBatchNorm", "SingleHPUStrategy"]
