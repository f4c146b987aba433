"""Fabric's ``"hpu_model_parallel"`` strategy: FSDP2 and tensor parallelism over a 2-D device mesh on HPUs."""

from __future__ import annotations

from typing import ClassVar

from lightning.fabric.strategies import ModelParallelStrategy, Strategy
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi.fabric.fsdp import FabricShardedCore
from lightning_gaudi.strategies._tied import move_keeping_ties
from lightning_gaudi.strategies.model_parallel import (
    LateArguments,
    ModelParallelCore,
    clip_grad_norm_,
    mesh_shape,
)


class HPUModelParallelStrategy(ModelParallelCore, FabricShardedCore, LateArguments, ModelParallelStrategy):
    """Fabric's counterpart of :class:`lightning_gaudi.HPUModelParallelStrategy`, with Fabric's arguments
    (``parallelize_fn(module, device_mesh)``)."""

    api = "Fabric"
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (ModelParallelStrategy,)

    @override
    def _set_world_ranks(self) -> None:
        mesh_shape(self._data_parallel_size, self._tensor_parallel_size, self.num_nodes, self.num_processes)
        super()._set_world_ranks()

    @override
    def module_to_device(self, module: Module) -> None:
        pass  # the plan places the parameters it shards (a meta-device model is materialized), setup_module the rest

    @override
    def setup_module(self, module: Module) -> Module:
        module = super().setup_module(module)
        self._reduce_with_sums(module)
        move_keeping_ties(module, self.root_device)
        return module

    @override
    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clips by the global norm over every rank's shards, plain and DTensor gradients alike."""
        self.precision.unscale_gradients(optimizer)
        return clip_grad_norm_(self.precision.main_params(optimizer), max_norm, norm_type)
