"""What every Fabric HPU strategy adds to the shared core."""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from lightning.fabric.utilities.distributed import ReduceOp
from lightning.fabric.utilities.types import Optimizable
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import compile_cache, hpu
from lightning_gaudi.strategies._tied import move_keeping_ties
from lightning_gaudi.strategies.core import HPUParallelCore, HPUStrategyCore


def rebind_parameters(optimizer: Optimizer, moved: dict[int, tuple[weakref.ref[Tensor], Tensor]]) -> None:
    """Points ``optimizer``'s groups and state at the parameters that replaced its own (``moved``: ``id(old) ->
    (weakref to old, new)``)."""

    def replacement(parameter: Tensor) -> Tensor:
        entry = moved.get(id(parameter))
        return entry[1] if entry is not None and entry[0]() is parameter else parameter

    for group in optimizer.param_groups:
        group["params"] = [replacement(parameter) for parameter in group["params"]]
    for old in list(optimizer.state):
        new = replacement(old)
        if new is not old:
            optimizer.state[new] = optimizer.state.pop(old)


def _explain_forward_error(module: Module, args: Any, output: Any) -> None:
    if (error := sys.exc_info()[1]) is not None:  # an always-called hook runs while the forward's error unwinds
        hpu.explain_error(error)


class FabricCore(HPUStrategyCore):
    """Fabric's hooks of every HPU strategy: tied weights kept, an optimizer built before ``fabric.setup`` following
    its model, lazy mode's graph cut after each backward and optimizer step, the note on an emulator's limits.

    Args:
        mark_step: ``False`` turns lazy mode's graph cuts off (like ``MarkStep(enabled=False)`` for the Trainer).
    """

    api = "Fabric"

    def __init__(self, *args: Any, mark_step: bool = True, **kwargs: Any) -> None:
        self._mark_step = mark_step
        self._mark: Callable[[], None] | None = None  # the backend's mark_step where it cuts graphs, bound at set-up
        self._moved: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}
        self._artifacts: bytes | None = None  # the compile cache artifacts last saved or loaded
        super().__init__(*args, **kwargs)

    def _bind_mark_step(self) -> None:
        backend = hpu.get_backend()
        self._mark = backend.mark_step if self._mark_step and backend.is_lazy() else None

    def compile_backend(self) -> str | compile_cache.NodeCompile:
        """The ``torch.compile`` backend of the execution mode, compiling once per node
        (:func:`~lightning_gaudi.compile_cache.node_backend`); ``ValueError`` in lazy mode, where it does not run."""
        backend = hpu.get_backend()
        if backend.is_lazy():
            raise ValueError(
                "A model compiled with torch.compile was passed to `fabric.setup`, but the HPU runs in lazy mode,"
                " where torch.compile does not run. Call lightning_gaudi.configure(execution_mode='compile') before"
                " building Fabric, or pass the model uncompiled."
            )
        name = backend.check_compile_backend()
        compile_cache.use(*compile_cache.strategy_key(self))
        return compile_cache.node_backend(name)

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        self._bind_mark_step()

    def setup_module(self, module: Module) -> Module:
        # Fabric sets up a single-device model without setup_environment unless launch() was called
        self._bind_mark_step()
        compile_cache.use(*compile_cache.strategy_key(self))
        backend = hpu.get_backend()
        if backend.explains_forward_errors:
            module.register_forward_hook(_explain_forward_error, always_call=True)
        return super().setup_module(module)  # type: ignore[misc,no-any-return]

    def save_checkpoint(self, path: Any, state: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Lightning's save, then (global rank 0) torch's portable compile artifacts beside it when they changed."""
        super().save_checkpoint(path, state, *args, **kwargs)  # type: ignore[misc]
        artifacts = compile_cache.strategy_artifacts(os.path.dirname(str(path)), self)
        if artifacts is not None and self.is_global_zero:  # type: ignore[attr-defined]
            self._artifacts = compile_cache.save_artifacts(artifacts, unless=self._artifacts)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """The portable compile artifacts beside ``path`` into torch's caches (before the model's first call compiles
        it), then Lightning's load."""
        artifacts = compile_cache.strategy_artifacts(os.path.dirname(str(path)), self)
        if artifacts is not None and (loaded := compile_cache.load_artifacts(artifacts)) is not None:
            self._artifacts = loaded
        return super().load_checkpoint(path, *args, **kwargs)  # type: ignore[misc]

    def module_to_device(self, module: Module) -> None:
        before = dict(module.named_parameters(remove_duplicate=False))
        move_keeping_ties(module, self.root_device)  # type: ignore[attr-defined]
        for name, parameter in module.named_parameters(remove_duplicate=False):
            old = before.get(name)
            if old is not None and old is not parameter:
                self._moved[id(old)] = (weakref.ref(old), parameter)

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        if self._moved:
            rebind_parameters(optimizer, self._moved)
        return super().setup_optimizer(optimizer)  # type: ignore[misc,no-any-return]

    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        try:
            super().backward(tensor, module, *args, **kwargs)  # type: ignore[misc]
            if self._mark is not None:
                self._mark()
        except BaseException as error:
            hpu.explain_error(error)  # the note the Trainer adds in on_exception, for an emulator's limits
            raise

    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        try:
            output = super().optimizer_step(optimizer, **kwargs)  # type: ignore[misc]
            if self._mark is not None:
                self._mark()
        except BaseException as error:
            hpu.explain_error(error)
            raise
        return output


class FabricParallelCore(FabricCore, HPUParallelCore):
    """Fabric's hooks of every distributed HPU strategy (the launch checked while Fabric sets the ranks)."""

    log = logging.getLogger("lightning.fabric.strategies.hpu")

    def _set_world_ranks(self) -> None:
        self.check_launch()
        super()._set_world_ranks()  # type: ignore[misc]

    @override
    def _set_ranks(self) -> None:
        self._set_world_ranks()

    def _setup_distributed(self) -> None:
        self._form_process_group()

    @property
    def process_group_backend(self) -> str:
        """The collective backend: the one asked for, else HCCL on a Gaudi and gloo in emulation."""
        return self._get_process_group_backend()

    def all_reduce(
        self, tensor: Tensor | Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Tensor | Any:
        """All-reduces ``tensor`` as the Trainer's strategies ``reduce`` it (:meth:`HPUParallelCore._all_reduce`)."""
        return self._all_reduce(tensor, group, reduce_op)
