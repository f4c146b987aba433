"""A module's ``forward`` replaced on the instance until put back (``HPUCompile``, ``HPUGraphs``):
``nn.Module.__call__`` runs ``self.forward``, which :func:`set_forward` checks; nothing is patched globally."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def missing_targets() -> list[str]:
    """What the replacement relies on and this torch lacks (empty when everything is as checked)."""
    probe = nn.Identity()
    vars(probe)["forward"] = lambda x: x + 1
    return [] if probe(1) == 2 else ["torch.nn.Module.__call__ running the instance's forward"]


def set_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
    """Sets ``module``'s instance ``forward``; returns the one it had (``None``: the class's). Raises
    ``RuntimeError`` where this torch does not call it (:func:`missing_targets`)."""
    if missing := missing_targets():
        raise RuntimeError(f"This torch does not call a module's own forward as checked: {missing}.")
    previous = vars(module).get("forward")
    vars(module)["forward"] = forward
    return previous


def restore_forward(module: nn.Module, previous: Callable[..., Any] | None) -> None:
    """Puts back what :func:`set_forward` returned."""
    if previous is None:
        vars(module).pop("forward", None)
    else:
        vars(module)["forward"] = previous
