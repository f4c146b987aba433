"""Fabric's ``"hpu_parallel"`` strategy: DistributedDataParallel over HCCL (gloo in emulation)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment, Precision
from lightning.fabric.strategies import DDPStrategy, Strategy
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_gaudi.distributed import DEFAULT_TIMEOUT
from lightning_gaudi.fabric._base import FabricParallelCore
from lightning_gaudi.patches import fabric_backward_sync
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.ddp_settings import PARALLEL_VARIANTS, DDPCore, DDPSettings


class HPUParallelStrategy(DDPCore, FabricParallelCore, DDPStrategy):
    """Fabric's counterpart of :class:`lightning_gaudi.HPUParallelStrategy`, with its arguments (``precision`` for
    ``precision_plugin``) and ``mark_step`` (:class:`~lightning_gaudi.fabric._base.FabricCore`)."""

    strategy_name = "hpu_parallel"
    registered_variants = PARALLEL_VARIANTS
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (DDPStrategy,)
    adoption = Adoption(extra="_ddp_kwargs")

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        bucket_cap_mb: float | None = DDPSettings.bucket_cap_mb,
        gradient_as_bucket_view: bool = DDPSettings.gradient_as_bucket_view,
        static_graph: bool = DDPSettings.static_graph,
        find_unused_parameters: bool = DDPSettings.find_unused_parameters,
        broadcast_buffers: bool | None = DDPSettings.broadcast_buffers,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        start_method: Literal["popen", "spawn"] = DDPSettings.start_method,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        fast_ddp: bool = DDPSettings.fast_ddp,
        mark_step: bool = True,
        **kwargs: Any,
    ) -> None:
        self.ddp_settings = settings = DDPSettings(
            bucket_cap_mb, gradient_as_bucket_view, static_graph, find_unused_parameters, broadcast_buffers,
            start_method, ddp_comm_state, ddp_comm_hook, ddp_comm_wrapper, fast_ddp, kwargs,
        ).check_extra(HPUParallelStrategy, DDPStrategy)  # fmt: skip
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,  # type: ignore[arg-type]  # coerced by the core
            start_method=start_method,
            mark_step=mark_step,
            **settings.ddp_kwargs,
        )

    @override
    def setup_module(self, module: Module) -> Module:  # type: ignore[override]
        """Wraps ``module`` in ``DistributedDataParallel`` (under ``fast_ddp``: takes rank 0's weights instead)."""
        self._bind_mark_step()
        if self.ddp_settings.fast_ddp:
            self._fast_ddp_setup(module)
            fabric_backward_sync.set_control(self, _FastDDPSync(self))  # no_backward_sync: accumulate locally
            return module
        # one process drives one card and the bridge binds it: no device_ids
        ddp = DistributedDataParallel(module=module, device_ids=None, **self.ddp_kwargs)
        self._on_ddp_wrapped(ddp)
        return ddp


class _FastDDPSync:
    """``fabric.no_backward_sync`` under fast DDP: gradients accumulate locally."""

    def __init__(self, strategy: HPUParallelStrategy) -> None:
        self._strategy = strategy

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[None]:
        return self._strategy._fast_ddp_accumulating() if enabled else nullcontext()
