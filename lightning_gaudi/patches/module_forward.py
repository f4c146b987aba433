"""A module's ``forward`` replaced on the instance until put back (``HPUCompile``, ``HPUGraphs``):
``nn.Module.__call__`` runs ``self.forward``, which :func:`install` checks; nothing is patched globally."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from lightning_gaudi.patches._checked import Checked

TARGETS = ("torch.nn.Module.__call__", "torch.nn.Module._call_impl")


def missing_targets() -> list[str]:
    """What the replacement relies on and this torch lacks (empty when everything is as checked)."""
    probe = nn.Identity()
    probe.forward = lambda x: x + 1  # type: ignore[method-assign,assignment]
    return [] if probe(1) == 2 else ["torch.nn.Module.__call__ running the instance's forward"]


def set_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
    """Sets ``module``'s instance ``forward``; returns the one it had (``None``: the class's). Raises
    ``RuntimeError`` where :func:`install`'s check failed."""
    if not installed():
        raise RuntimeError(f"This torch does not call a module's own forward as checked: {missing_targets()}.")
    previous = vars(module).get("forward")
    module.forward = forward  # type: ignore[method-assign]
    return previous


def restore_forward(module: nn.Module, previous: Callable[..., Any] | None) -> None:
    """Puts back what :func:`set_forward` returned."""
    if previous is None:
        vars(module).pop("forward", None)
    else:
        module.forward = previous  # type: ignore[method-assign]


_State = Checked(missing_targets, "HPUCompile and HPUGraphs are unavailable; training runs uncompiled.", torch=True)
installed, install = _State.installed, _State.install
PATCH = _State.patch("module_forward", TARGETS)
