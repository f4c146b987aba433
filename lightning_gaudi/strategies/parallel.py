"""The ``"hpu_parallel"`` strategy: DistributedDataParallel over HCCL (gloo in emulation)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, Strategy
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_gaudi.distributed import DEFAULT_TIMEOUT
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import TrainerParallelCore
from lightning_gaudi.strategies.ddp_settings import PARALLEL_VARIANTS, DDPCore, DDPSettings


class HPUParallelStrategy(DDPCore, TrainerParallelCore, DDPStrategy):
    """Data-parallel training on several HPUs, one process per card, with ``DistributedDataParallel``; Lightning's
    DDP names (``"ddp"``...) run it with ``accelerator="hpu"``.

    Args:
        accelerator, parallel_devices, cluster_environment, checkpoint_io, process_group_backend, timeout: as every
            HPU strategy (:class:`~lightning_gaudi.strategies.core.HPUStrategyCore`).
        precision_plugin: e.g. :class:`~lightning_gaudi.precision.HPUPrecision`.
        bucket_cap_mb, gradient_as_bucket_view, static_graph, find_unused_parameters, broadcast_buffers, start_method,
            fast_ddp, ddp_comm_*: see :class:`~lightning_gaudi.strategies.ddp_settings.DDPSettings`.
        **kwargs: any other ``DistributedDataParallel`` argument.

    Raises:
        TypeError: an argument ``DistributedDataParallel`` does not take, or one the strategy sets itself.
        ValueError: a bad ``bucket_cap_mb``, ``timeout`` or ``start_method``.
    """

    strategy_name = "hpu_parallel"
    registered_variants = PARALLEL_VARIANTS
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (DDPStrategy,)
    adoption = Adoption(
        extra="_ddp_kwargs",
        refused={
            "model_averaging_period": "is post-local SGD model averaging, which Lightning sets up on CUDA only; it is"
            " not offered on HPUs. Remove it, or pass your own `ddp_comm_hook`."
        },
    )

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
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
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **settings.ddp_kwargs,
        )

    @override
    def configure_ddp(self) -> None:
        if self.ddp_settings.fast_ddp:
            assert self.model is not None
            self._fast_ddp_setup(self.model)  # no wrapper: the gradients are all-reduced after backward
            return
        super().configure_ddp()
        assert isinstance(self.model, DistributedDataParallel)
        self._on_ddp_wrapped(self.model)

    @contextmanager
    @override
    def block_backward_sync(self) -> Generator[None, None, None]:
        if not self.ddp_settings.fast_ddp:
            with super().block_backward_sync():
                yield
            return
        with self._fast_ddp_accumulating():
            yield

    @override
    def determine_ddp_device_ids(self) -> list[int] | None:
        return None  # one process drives one card; the bridge binds it
