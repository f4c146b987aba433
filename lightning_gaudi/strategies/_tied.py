"""Tied weights kept shared across the move to the device: ``Module.to`` makes a new parameter for every module that
holds one when it does not convert in place (Lazy Tensor Core, the HPU per Intel's guide), untying a head from its
embedding."""

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
    """``module.to(device)``, after which the parameters shared before the move are shared again."""
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
