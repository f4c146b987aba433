"""The DDP settings and behaviour the Trainer's and Fabric's ``HPUParallelStrategy`` share."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel

from lightning_gaudi.strategies.core import refuse_unknown_arguments

#: ``DistributedDataParallel`` arguments the strategies pass themselves.
SET_BY_STRATEGY = ("module", "device_ids")
#: How extra local ranks may start: a forked child cannot take over its parent's HPU.
START_METHODS = ("popen", "spawn")
#: The names the data-parallel HPU strategies register besides their own, and the arguments each implies.
PARALLEL_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("hpu_ddp", {}),  # lightning-habana's name
    ("hpu_parallel_spawn", {"start_method": "spawn"}),
    ("hpu_parallel_find_unused_parameters_true", {"find_unused_parameters": True}),
    ("hpu_parallel_static_graph", {"static_graph": True}),
    ("hpu_fast_ddp", {"fast_ddp": True}),
)
#: The bucket size of fast DDP's flat gradient buffers when ``bucket_cap_mb`` is not given (MB).
FAST_DDP_BUCKET_MB = 100.0


@dataclass(frozen=True)
class DDPSettings:
    """How the HPU data-parallel strategies wrap the model in ``DistributedDataParallel``, checked when built.

    Args:
        bucket_cap_mb: gradient bucket size in MB (torch's 25 when ``None``; Intel suggests 100 to 230).
        gradient_as_bucket_view, static_graph, find_unused_parameters, broadcast_buffers: as
            ``DistributedDataParallel``'s (``None``: torch's default).
        start_method: how extra local ranks start: "popen" (re-run the script) or "spawn".
        comm_state, comm_hook, comm_wrapper: a DDP communication hook, its state and wrapper.
        fast_ddp: no wrapper (optimum-habana's ``fast_ddp``): rank 0's weights broadcast once, the gradients
            all-reduced after backward in flat buffers of ``bucket_cap_mb`` (100 by default).
        extra: any other ``DistributedDataParallel`` argument.
    """

    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool | None = None
    start_method: Literal["popen", "spawn"] = "popen"
    comm_state: object | None = None
    comm_hook: Callable[..., Any] | None = None
    comm_wrapper: Callable[..., Any] | None = None
    fast_ddp: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        value = self.bucket_cap_mb
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value))
        ):
            raise ValueError(
                f"`bucket_cap_mb={value!r}` must be a positive number of megabytes (Intel suggests 100-230)."
            )
        if self.start_method not in START_METHODS:
            raise ValueError(f"`start_method={self.start_method!r}` is not supported on HPU; use 'popen' or 'spawn'.")
        if self.fast_ddp and (
            self.comm_hook is not None or self.find_unused_parameters or self.static_graph or self.broadcast_buffers
        ):
            raise ValueError(
                "`fast_ddp=True` all-reduces the gradients without DistributedDataParallel: it takes no"
                " `ddp_comm_hook`, `find_unused_parameters`, `static_graph` or `broadcast_buffers=True`. Remove them,"
                " or use fast_ddp=False."
            )

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``DistributedDataParallel`` is built with (besides the module)."""
        optional = {"bucket_cap_mb": self.bucket_cap_mb, "broadcast_buffers": self.broadcast_buffers}
        return {
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
            "find_unused_parameters": self.find_unused_parameters,
            **{key: value for key, value in optional.items() if value is not None},
            **self.extra,
        }

    def check_extra(self, owner: type, base: type) -> DDPSettings:
        """These settings; ``TypeError`` for an ``extra`` argument neither DDP nor ``base`` takes, or one the strategy
        sets itself."""
        ddp = inspect.signature(DistributedDataParallel.__init__).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ddp.values()):
            return self
        accepted = ((set(ddp) - {"self", "kwargs"}) | _parameters(base)) - set(SET_BY_STRATEGY)
        own = _parameters(owner)
        refuse_unknown_arguments(
            owner.__name__, self.extra, accepted, "torch.nn.parallel.DistributedDataParallel's", accepted | own,
            f" DistributedDataParallel takes: {', '.join(sorted(accepted - own))}.", SET_BY_STRATEGY,
        )  # fmt: skip
        return self


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls).parameters) - {"kwargs"}


class DDPCore:
    """What the HPU data-parallel strategies add to Lightning's DDP: the communication hook on the HPU, the first
    step's gradients released under ``gradient_as_bucket_view`` (DDP rebuilds the buckets they view), and fast DDP."""

    ddp_settings: DDPSettings
    _fast_modules: list[Module]
    _release_first_gradients = False
    _accumulating = False  # fast DDP: gradients accumulate locally until the step's last micro-batch

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        return self.ddp_settings.ddp_kwargs

    def _on_ddp_wrapped(self, model: DistributedDataParallel) -> None:
        settings = self.ddp_settings
        if settings.comm_hook is not None:
            hook = settings.comm_hook if settings.comm_wrapper is None else settings.comm_wrapper(settings.comm_hook)
            model.register_comm_hook(settings.comm_state, hook)
        self._release_first_gradients = settings.gradient_as_bucket_view

    def optimizer_step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, *args, **kwargs)  # type: ignore[misc]
        if self._release_first_gradients:
            self._release_first_gradients = False
            optimizer.zero_grad(set_to_none=True)
        return output

    def _fast_ddp_setup(self, module: Module) -> None:
        """Fast DDP's start: every rank takes rank 0's parameters and buffers (as DDP's wrapper does)."""
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        self._fast_modules = [module]
        self._fast_buckets = None

    @contextmanager
    def _fast_ddp_accumulating(self) -> Iterator[None]:
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def _after_backward(self) -> None:
        """Fast DDP: averages the gradients over the ranks in flat buffers of at most ``bucket_cap_mb`` per dtype."""
        if self._accumulating or not self.ddp_settings.fast_ddp:
            return
        if self._fast_buckets is None:
            self._fast_buckets = self._fast_ddp_buckets()
        world = dist.get_world_size()
        for bucket in self._fast_buckets:
            grads = [parameter.grad for parameter in bucket if parameter.grad is not None]
            if len(grads) != len(bucket):
                raise RuntimeError(
                    "fast_ddp: a parameter got no gradient on this rank in this step; every trainable parameter needs"
                    " one. Use fast_ddp=False with find_unused_parameters=True for such a model."
                )
            flat = torch.cat([grad.reshape(-1) for grad in grads])
            dist.all_reduce(flat)  # a sum: HCCL has no average
            flat.div_(world)
            for grad, reduced in zip(grads, flat.split([grad.numel() for grad in grads]), strict=True):
                grad.copy_(reduced.view_as(grad))

    _fast_buckets: list[list[Tensor]] | None = None

    def _fast_ddp_buckets(self) -> list[list[Tensor]]:
        cap = (self.ddp_settings.bucket_cap_mb or FAST_DDP_BUCKET_MB) * 1024 * 1024
        groups: dict[tuple[torch.dtype, torch.device], tuple[list[list[Tensor]], list[float]]] = {}
        for module in self._fast_modules:
            for parameter in module.parameters():
                if not parameter.requires_grad:
                    continue
                buckets, sizes = groups.setdefault((parameter.dtype, parameter.device), ([[]], [0.0]))
                size = parameter.numel() * parameter.element_size()
                if buckets[-1] and sizes[-1] + size > cap:
                    buckets.append([])
                    sizes.append(0.0)
                buckets[-1].append(parameter)
                sizes[-1] += size
        return [bucket for buckets, _ in groups.values() for bucket in buckets]
