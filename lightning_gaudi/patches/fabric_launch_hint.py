"""Fabric's refusal to set up an unlaunched multi-device job names the command that starts it on the HPU (Lightning's
``fabric run`` has no HPU accelerator): the wrapped private ``Fabric._validate_launched`` adds :attr:`Hooks.hint`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_gaudi.patches import registry

_MODULE = "lightning.fabric.fabric"
_CLASS = "Fabric"
WRAPPED = ("_validate_launched",)
#: How Lightning's refusal begins (the wrapper adds to this one only).
REFUSAL = "To use Fabric with more than one device, you must call `.launch()`"
_MARK = "__lightning_gaudi_launch_hint__"


@dataclass
class Hooks:
    """The policy the wrapper asks: ``hint(fabric)``, the line to add to the refusal (``None``: none)."""

    hint: Callable[[Any], str | None] | None = None


HOOKS = Hooks()


def fabric_class() -> type | None:
    """Lightning's ``Fabric``, or ``None`` when this Lightning has none where expected."""
    return registry.find_class(_MODULE, _CLASS)


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    method = getattr(fabric_class(), WRAPPED[0], None)
    code = getattr(inspect.unwrap(method) if callable(method) else None, "__code__", None)
    if code is None or not any(isinstance(c, str) and c.startswith(REFUSAL) for c in code.co_consts):
        return [f"{_MODULE}.{_CLASS}.{WRAPPED[0]} raising {REFUSAL!r}"]
    return []


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        try:
            original(self)
        except RuntimeError as error:
            hint = HOOKS.hint(self) if HOOKS.hint is not None else None
            message = error.args[0] if len(error.args) == 1 else None
            if hint and isinstance(message, str) and message.startswith(REFUSAL) and hint not in message:
                error.args = (f"{message} {hint}",)
            raise

    return wrapper


def installed() -> bool:
    """Whether ``Fabric._validate_launched`` is wrapped and a policy is set."""
    return HOOKS.hint is not None and registry.wrapped(fabric_class(), WRAPPED, _MARK)


def install() -> bool:
    """Wraps ``Fabric._validate_launched`` (idempotent); returns whether the patch is in effect."""
    if installed():
        return True
    fallback = (
        "Fabric's refusal of an unlaunched multi-device job will not name the HPU's command: start such scripts with"
        " `python -m lightning_gaudi fabric run --accelerator hpu --devices N SCRIPT`."
    )
    wrappers = dict.fromkeys(WRAPPED, _wrap)
    return registry.wrap_once(fabric_class(), wrappers, _MARK, missing_targets(), fallback) and installed()


PATCH = registry.Patch(
    name="fabric_launch_hint",
    targets=tuple(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
