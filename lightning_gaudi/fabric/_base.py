"""What both Fabric HPU strategies add to Lightning's: the accelerator check, the move to the HPU with the optimizer
following it, and lazy mode's graph cuts (Fabric has no callbacks that could place them)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from lightning.fabric.accelerators import Accelerator
from lightning.fabric.strategies import Strategy
from lightning.fabric.utilities.types import Optimizable
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.strategies._tied import move_keeping_ties


def check_hpu_accelerator(strategy_name: str, accelerator: Accelerator | None) -> None:
    """Raises a clear error when a Fabric HPU strategy is given any accelerator but :class:`HPUAccelerator`."""
    if accelerator is not None and not isinstance(accelerator, HPUAccelerator):
        raise ValueError(
            f"The {strategy_name!r} strategy runs on HPUs, but the accelerator is {type(accelerator).__name__}."
            " Pass `Fabric(accelerator='hpu', ...)` (on a machine without Gaudi, set LIGHTNING_GAUDI_EMULATE=eager)."
        )


def rebind_parameters(optimizer: Optimizer, moved: dict[int, tuple[weakref.ref[Tensor], Tensor]]) -> None:
    """Points ``optimizer`` (its parameter groups and its state) at the parameters that replaced the ones it holds.

    Args:
        optimizer: an optimizer built on a module's parameters before the module moved.
        moved: ``id(old) -> (weak reference to old, new)``, as :meth:`HPUStrategyMixin.module_to_device` records.
    """

    def replacement(parameter: Tensor) -> Tensor:
        entry = moved.get(id(parameter))
        return entry[1] if entry is not None and entry[0]() is parameter else parameter

    for group in optimizer.param_groups:
        group["params"] = [replacement(parameter) for parameter in group["params"]]
    for old in list(optimizer.state):
        new = replacement(old)
        if new is not old:
            optimizer.state[new] = optimizer.state.pop(old)


class HPUStrategyMixin(Strategy):
    """The HPU behaviour of :class:`~lightning_gaudi.fabric.SingleHPUStrategy` and
    :class:`~lightning_gaudi.fabric.HPUParallelStrategy`, placed before Lightning's strategy class in their bases.

    - The accelerator must be the HPU's.
    - ``module_to_device`` keeps tied weights tied (``Module.to`` unties them on lazy tensors) and records which
      parameters the move replaced: a move to torch's Lazy Tensor Core (lazy emulation), and on a Gaudi, makes new
      parameter objects, and an optimizer built before ``fabric.setup`` is pointed at them in ``setup_optimizer``
      instead of stepping the CPU copies that no longer get gradients.
    - In lazy mode the graph is cut (``mark_step``) after each ``fabric.backward`` and after each optimizer step, the
      points Intel recommends and what :class:`~lightning_gaudi.callbacks.MarkStep` does for the Trainer: 2 per step,
      none in eager or compile mode. ``mark_step=False`` turns them off.

    Subclasses call :meth:`_init_hpu` from ``__init__``.
    """

    strategy_name: str

    def _init_hpu(self, mark_step: bool) -> None:
        self._mark_step = mark_step
        self._mark: Callable[[], None] | None = None  # the backend's mark_step where it cuts graphs, bound at set-up
        self._moved: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}

    def _check_accelerator(self, accelerator: Accelerator | None) -> None:
        check_hpu_accelerator(self.strategy_name, accelerator)

    @property
    @override
    def accelerator(self) -> Accelerator | None:
        return self._accelerator

    @accelerator.setter
    @override
    def accelerator(self, accelerator: Accelerator | None) -> None:
        self._check_accelerator(accelerator)
        self._accelerator = accelerator

    def _bind_mark_step(self) -> None:
        backend = hpu.get_backend()
        self._mark = backend.mark_step if self._mark_step and backend.is_lazy() else None

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._bind_mark_step()

    @override
    def setup_module(self, module: Module) -> Module:
        # Fabric sets up a single-device model without setup_environment unless launch() was called
        self._bind_mark_step()
        return super().setup_module(module)

    @override
    def module_to_device(self, module: Module) -> None:
        before = dict(module.named_parameters(remove_duplicate=False))
        move_keeping_ties(module, self.root_device)
        for name, parameter in module.named_parameters(remove_duplicate=False):
            old = before.get(name)
            if old is not None and old is not parameter:
                self._moved[id(old)] = (weakref.ref(old), parameter)

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        if self._moved:
            rebind_parameters(optimizer, self._moved)
        return super().setup_optimizer(optimizer)

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        super().backward(tensor, module, *args, **kwargs)
        if self._mark is not None:
            self._mark()

    @override
    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, **kwargs)
        if self._mark is not None:
            self._mark()
        return output
