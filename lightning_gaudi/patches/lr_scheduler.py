"""Rebinding a torch LR scheduler to a replacement optimizer, keeping torch's step-order check.

``torch.optim.lr_scheduler.LRScheduler.__init__`` wraps its optimizer's ``step``: the wrapper carries the private
flag ``_wrapped_by_lr_sched`` and sets ``optimizer._opt_called`` when it runs. On its first call after construction
``LRScheduler.step`` warns "Seems like `optimizer.step()` has been overridden" when the optimizer's ``step`` lacks
the flag, and "Detected call of `lr_scheduler.step()` before `optimizer.step()`" when ``_opt_called`` is unset.
A scheduler moved to a new optimizer (:class:`~lightning_gaudi.callbacks.FusedOptimizers` does so) would give the
first warning falsely and lose the second; :func:`rebind_scheduler` marks the new optimizer's ``step`` the way
torch does. ``tests/patches/test_lr_scheduler.py`` fails when torch stops using these flags.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.optim import Optimizer

from lightning_gaudi.patches import registry

#: torch's private flags: on a scheduler-wrapped ``optimizer.step``, and set on the optimizer when that step runs.
STEP_WRAPPED_FLAG = "_wrapped_by_lr_sched"
STEP_CALLED_FLAG = "_opt_called"


class _State:
    enabled = False


def installed() -> bool:
    """Whether :func:`rebind_scheduler` keeps torch's step-order check (this torch was checked)."""
    return _State.enabled


def install() -> bool:
    """Checks the torch version (idempotent). Returns whether :func:`rebind_scheduler` marks the new ``step``.

    On a torch outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_TORCH` a warning says what still works:
    schedulers follow the replacement optimizers, without torch's step-order check.
    """
    if _State.enabled:
        return True
    supported = registry.TORCH_SUPPORTED
    if not supported or not hasattr(torch.optim.lr_scheduler, "LRScheduler"):
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_TORCH} ({supported.message or 'ok'}):"
            " FusedOptimizers still moves LR schedulers to the fused optimizers, but torch's warning about calling"
            " `lr_scheduler.step()` before `optimizer.step()` may then be missing, or be given falsely.",
            stacklevel=2,
        )
        return False
    _State.enabled = True
    return True


def rebind_scheduler(scheduler: Any, old: Optimizer, new: Optimizer) -> None:
    """Makes ``scheduler`` drive ``new`` instead of ``old``, keeping torch's step-order check working.

    Args:
        scheduler: a torch LR scheduler (anything with an ``optimizer`` attribute) bound to ``old``.
        old: the optimizer the scheduler was built with.
        new: its replacement.
    """
    scheduler.optimizer = new
    if not installed():
        return
    if hasattr(old.step, STEP_WRAPPED_FLAG) and not hasattr(new.step, STEP_WRAPPED_FLAG):
        step = new.step

        @functools.wraps(step)
        def marked_step(*args: Any, **kwargs: Any) -> Any:
            setattr(new, STEP_CALLED_FLAG, True)
            return step(*args, **kwargs)

        setattr(marked_step, STEP_WRAPPED_FLAG, True)
        new.step = marked_step  # type: ignore[method-assign]


PATCH = registry.Patch(
    name="lr_scheduler",
    # __init__ marks the optimizer's step (STEP_WRAPPED_FLAG, STEP_CALLED_FLAG); step reads both
    targets=("torch.optim.lr_scheduler.LRScheduler.__init__", "torch.optim.lr_scheduler.LRScheduler.step"),
    requirement=registry.SUPPORTED_TORCH,
    install=install,
    installed=installed,
)
