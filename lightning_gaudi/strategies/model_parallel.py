"""The ``"hpu_model_parallel"`` strategy: FSDP2 and tensor parallelism over a 2-D device mesh on HPUs."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.precision import HalfPrecision, Precision
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.distributed import DEFAULT_TIMEOUT, coerce_timeout
from lightning_gaudi.patches.launcher import add_check
from lightning_gaudi.precision import HPUPrecision
from lightning_gaudi.strategies._staged import save_sharded_checkpoint
from lightning_gaudi.strategies.core import HPUParallelCore, TrainerParallelCore

if TYPE_CHECKING:
    import lightning.pytorch as pl

MeshSize = int | Literal["auto"]


def mesh_shape(data_parallel: MeshSize, tensor_parallel: MeshSize, num_nodes: int, per_node: int) -> tuple[int, int]:
    """The mesh shape; ``"auto"`` is the node count and the cards per node. ``ValueError`` for a bad size or product."""
    for name, value in (("data_parallel_size", data_parallel), ("tensor_parallel_size", tensor_parallel)):
        if value != "auto" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"`{name}={value!r}` must be a positive int or 'auto'.")
    shape = (
        num_nodes if data_parallel == "auto" else data_parallel,
        per_node if tensor_parallel == "auto" else tensor_parallel,
    )
    if shape[0] * shape[1] != num_nodes * per_node:
        raise ValueError(
            f"`data_parallel_size={shape[0]}` x `tensor_parallel_size={shape[1]}` must equal the world size,"
            f" {num_nodes} node(s) x {per_node} device(s) = {num_nodes * per_node}. Change the sizes or `devices`."
        )
    return shape  # type: ignore[return-value]


class ModelParallelCore(HPUParallelCore):
    """What the Trainer's and Fabric's ``hpu_model_parallel`` share (placed first in the bases)."""

    strategy_name = "hpu_model_parallel"
    backward_collective = "backward (tensor-parallel and FSDP2 gradient collectives)"
    forward_collective = "forward (tensor-parallel activations or FSDP2 parameter all-gather)"

    device_mesh: Any

    def _reduce_with_sums(self, module: nn.Module) -> None:
        """Has every FSDP2 module of the user's plan reduce with sums (:func:`reduce_with_sums`)."""
        reduce_with_sums(module, self.device_mesh["data_parallel"].size(), self.strategy_name)

    @override
    def _check_runnable(self) -> None:
        if hpu.get_backend().is_lazy():  # DTensor, which FSDP2 and tensor parallelism build on
            raise ValueError(
                f"{self.strategy_name!r} cannot run in lazy mode: Intel supports DTensor (FSDP2, tensor parallelism) in"
                " eager and compile mode only. Use lightning_gaudi.configure(execution_mode='compile'), or strategy"
                " 'hpu_fsdp'."
            )


def fsdp_reduces_with_sums() -> bool:
    """Whether this torch's FSDP2 has ``set_force_sum_reduction_for_comms`` (torch 2.8 and later)."""
    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def reduce_with_sums(module: nn.Module, data_parallel_size: int, strategy_name: str) -> int:
    """Makes every FSDP2 module in ``module`` reduce its gradients with ``ReduceOp.SUM`` and divide them itself
    (``set_force_sum_reduction_for_comms``, per module); returns how many it set.

    FSDP2 reduces with ``ReduceOp.AVG`` or ``PREMUL_SUM``, which HCCL lacks (``_get_gradient_divide_factors`` in
    ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``). torch 2.7 has no public route to a sum, and its
    FSDP2 reduce-scatters with ``AVG`` even over one data-parallel rank (``foreach_reduce``, torch 2.7.1
    ``_fsdp_collectives.py:404-410``): this raises ``RuntimeError`` at set-up instead of HCCL's at the first backward.
    """
    fsdp_modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not fsdp_modules:
        return 0
    if not fsdp_reduces_with_sums():
        raise RuntimeError(
            f"{strategy_name!r} cannot shard with FSDP2 on torch {torch.__version__} ({data_parallel_size}"
            " data-parallel HPUs): this FSDP2 reduces gradients with ReduceOp.AVG, which HCCL does not have, and can"
            " sum only in torch 2.8. Use Intel Gaudi software 1.23 or later (torch 2.9), strategy 'hpu_fsdp', or"
            " tensor parallelism alone (no fully_shard in the plan)."
        )
    for fsdp_module in fsdp_modules:
        fsdp_module.set_force_sum_reduction_for_comms(True)
    return len(fsdp_modules)


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Clips the gradients of ``parameters`` (DTensors of any placement and plain tensors) by their global norm over
    every rank's shards, a collective; returns that norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        local.mul_(coefficient.to(local.device, local.dtype))
    return total


class DTensorClipping(Precision):
    """A precision plugin clipping by the norm over every rank's shards (:func:`clip_grad_norm_`)."""

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: int | float) -> None:
        clip_grad_norm_(self.main_params(optimizer), clip_val)


class ModelParallelPrecision(DTensorClipping):
    """``"32-true"`` under ``hpu_model_parallel``."""


class ModelParallelHalfPrecision(DTensorClipping, HalfPrecision):
    """``"bf16-true"``, ``"16-true"`` under ``hpu_model_parallel``."""


class ModelParallelMixedPrecision(DTensorClipping, HPUPrecision):
    """``"bf16-mixed"``, ``"16-mixed"`` under ``hpu_model_parallel`` (the HPU's autocast)."""


class LateArguments:
    """Takes the arguments every strategy takes, which Lightning's ``ModelParallelStrategy`` does not, and sets them
    after its ``__init__``."""

    def __init__(self, *args: Any, timeout: timedelta | float | None = DEFAULT_TIMEOUT, **kwargs: Any) -> None:
        names = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin")
        given = {name: kwargs.pop(name) for name in (*names, "precision") if name in kwargs}
        if getattr(self, "api", "") == "Trainer":  # Fabric's takes no checkpoint IO
            given["checkpoint_io"] = given.get("checkpoint_io") or HPUCheckpointIO()
        super().__init__(*args, timeout=coerce_timeout(timeout), **kwargs)  # type: ignore[call-arg]
        for name, value in given.items():
            if value is not None:
                setattr(self, name, value)


def require_configure_model(strategy_name: str, module: Any) -> None:
    """Raises ``TypeError`` when ``module`` does not define ``configure_model``, where the parallel plan is applied."""
    if module is not None and not is_overridden("configure_model", module):
        raise TypeError(
            f"{strategy_name!r} needs `configure_model()` in {type(module).__name__}: apply the tensor-parallel plan"
            " (parallelize_module) or FSDP2 (fully_shard) there, on `self.device_mesh`. No process was started."
        )


class HPUModelParallelStrategy(ModelParallelCore, TrainerParallelCore, LateArguments, ModelParallelStrategy):
    """FSDP2 and tensor parallelism on HPUs: Lightning's ``ModelParallelStrategy`` with the 2-D mesh ``(data_parallel,
    tensor_parallel)`` as ``self.device_mesh`` in ``configure_model``; clipping by the global norm over every shard.

    Args:
        *args, **kwargs: Lightning's ``data_parallel_size``, ``tensor_parallel_size``, ``save_distributed_checkpoint``,
            ``process_group_backend``, and the arguments every HPU strategy takes.

    Raises:
        ValueError: bad sizes or sizes whose product is not the world size, lazy mode, a bad ``timeout``.
        TypeError: a LightningModule without ``configure_model`` (before any process starts).
    """

    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (ModelParallelStrategy,)

    @override
    def _configure_launcher(self) -> None:
        mesh_shape(self._data_parallel_size, self._tensor_parallel_size, self.num_nodes, self.num_processes)
        super()._configure_launcher()
        name = self.strategy_name
        self._launcher = add_check(
            self._launcher, lambda trainer: require_configure_model(name, trainer.lightning_module)
        )

    @override
    def _setup_distributed(self) -> None:
        self._form_process_group()  # HCCL (gloo in emulation); the mesh is then built on the root device's type

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self._reduce_with_sums(self.model)  # the plan of configure_model is applied by now
        super().setup(trainer)

    def hpu_precision_plugin(self, precision: str) -> Precision | None:
        """The precision plugin for ``Trainer(precision=...)``: one clipping over the shards."""
        if precision in ("bf16-mixed", "16-mixed"):
            return ModelParallelMixedPrecision(precision)  # type: ignore[arg-type]
        if precision in ("bf16-true", "16-true"):
            return ModelParallelHalfPrecision(precision)  # type: ignore[arg-type]
        return ModelParallelPrecision() if precision == "32-true" else None

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        if not self._save_distributed_checkpoint:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        save_sharded_checkpoint(self, checkpoint, filepath, storage_options, model_key="state_dict")
