"""The DDP settings of the data-parallel HPU strategies, one typed and checked object that the Trainer's and Fabric's
``HPUParallelStrategy`` share, and the DDP behaviour both add to Lightning's (communication hooks on the HPU, the
release of the first step's gradients)."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch.nn.parallel import DistributedDataParallel

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
)


@dataclass(frozen=True)
class DDPSettings:
    """How the HPU data-parallel strategies wrap the model in ``DistributedDataParallel``; checked when built, so a
    bad value fails before any process starts.

    Args:
        bucket_cap_mb: gradient bucket size in MB (torch's default 25 when ``None``). Larger buckets mean fewer
            all-reduce launches; Intel reports 100 MB best for ResNet50 and 200 MB for ResNeXt101.
        gradient_as_bucket_view: let gradients be views into the all-reduce buckets, saving one gradient copy of
            memory (Intel's advice on Gaudi, hence the default ``True``). The first optimizer step's gradients are
            then released right after it, so DDP's bucket rebuild in the second step never holds two copies.
        static_graph: tell DDP the set of used parameters and the graph never change between iterations.
        find_unused_parameters: search the autograd graph for parameters without gradients each step; leave
            ``False`` unless the model really skips parameters (it costs a graph traversal per step).
        broadcast_buffers: broadcast module buffers from rank 0 at each forward; ``None`` leaves torch's default.
        start_method: how extra local ranks start: "popen" (re-run the script) or "spawn".
        comm_state: the state passed to ``comm_hook``.
        comm_hook: a DDP communication hook (``hook(state, bucket) -> Future``), registered on the HPU.
        comm_wrapper: wraps ``comm_hook`` before registration (e.g. a compression wrapper).
        extra: any other ``DistributedDataParallel`` argument, passed through.

    Raises:
        ValueError: ``bucket_cap_mb`` is not a positive finite number, or ``start_method`` is neither "popen" nor
            "spawn".
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
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        value = self.bucket_cap_mb
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value))
        ):
            raise ValueError(
                f"`bucket_cap_mb={value!r}` must be a positive number of megabytes (Intel suggests 100 to 230"
                " on Gaudi)."
            )
        if self.start_method not in START_METHODS:
            raise ValueError(f"`start_method={self.start_method!r}` is not supported on HPU; use 'popen' or 'spawn'.")

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``DistributedDataParallel`` is built with (besides the module)."""
        kwargs: dict[str, Any] = {
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
            "find_unused_parameters": self.find_unused_parameters,
        }
        if self.bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = self.bucket_cap_mb
        if self.broadcast_buffers is not None:
            kwargs["broadcast_buffers"] = self.broadcast_buffers
        return {**kwargs, **self.extra}

    def check_extra(self, owner: type, base: type) -> None:
        """Refuses an ``extra`` argument that neither ``DistributedDataParallel`` nor Lightning's DDP strategy
        ``base`` takes, naming the likely intended one.

        Raises:
            TypeError: such an argument (with the closest name), or one the strategy sets itself.
        """
        ddp = inspect.signature(DistributedDataParallel.__init__).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ddp.values()):
            return
        accepted = ((set(ddp) - {"self", "kwargs"}) | _parameters(base)) - set(SET_BY_STRATEGY)
        own = _parameters(owner)
        for name in self.extra:
            if name in SET_BY_STRATEGY:
                raise TypeError(
                    f"`{name}` is set by {owner.__name__} itself when it wraps the model in DistributedDataParallel;"
                    " remove it."
                )
            if name not in accepted:
                close = difflib.get_close_matches(name, sorted(accepted | own), n=1)
                hint = (
                    f" Did you mean {close[0]!r}?"
                    if close
                    else f" DistributedDataParallel takes: {', '.join(sorted(accepted - own))}."
                )
                raise TypeError(
                    f"{owner.__name__} got an unexpected keyword argument {name!r}: it is neither one of its own"
                    f" arguments nor one of torch.nn.parallel.DistributedDataParallel's.{hint}"
                )


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls).parameters) - {"kwargs"}


class DDPCore:
    """What the HPU data-parallel strategies (Trainer's and Fabric's) add to Lightning's DDP: the communication hook
    registered on the HPU (Lightning registers them on CUDA only), and the release of the first optimizer step's
    gradients under ``gradient_as_bucket_view`` (DDP rebuilds its buckets in the second step; gradients still viewing
    the first step's buckets would keep a whole extra gradient copy alive at the peak)."""

    ddp_settings: DDPSettings
    _release_first_gradients = False

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``DistributedDataParallel`` is built with."""
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
