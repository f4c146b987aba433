"""Parameters shared between modules (tied weights), kept shared across the strategies' move to the device.

``Module.to`` keeps a parameter shared only when it converts it in place. A move to tensors of another kind (torch's
Lazy Tensor Core under lazy emulation; Intel's Gaudi guide warns of the same on the HPU), or any move under
``torch.__future__.set_overwrite_module_params_on_conversion(True)``, makes a new parameter for every module that
holds it: a language model's head tied to its token embedding becomes a second weight, trained on its own.
"""

from __future__ import annotations

import torch
from torch.nn import Module


def find_tied_parameters(module: Module) -> list[list[str]]:
    """The groups of two or more qualified names under which ``module`` holds one parameter, in registration order."""
    names: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def move_keeping_ties(module: Module, device: torch.device) -> None:
    """``module.to(device)``, after which the parameters shared before the move are shared again.

    Each name of a group gets the moved parameter of the group's first name; the copies the move made for the other
    names are dropped.
    """
    tied = find_tied_parameters(module)
    module.to(device)
    restore_ties(module, tied)


def restore_ties(module: Module, tied: list[list[str]]) -> None:
    """Makes each group of names (from :func:`find_tied_parameters`) share its first name's parameter again."""
    for first, *others in tied:
        parameter = module.get_parameter(first)
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, parameter)
