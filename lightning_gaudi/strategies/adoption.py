"""Strategy objects built by other code (LitGPT's ``FSDPStrategy(...)``, Ray's ``RayDDPStrategy()``) run on the HPU:
:func:`adopt` puts the HPU stand-in of their Lightning class under their own class, built with their arguments."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Adoption:
    """How an HPU strategy reads back the arguments of its Lightning counterpart's instance: ``name`` from the
    attribute ``_name``, else ``name``, unless declared here.

    Args:
        extra: the attribute holding the ``**kwargs`` Lightning was given.
        folded: arguments Lightning folds into another one that is read back (a DeepSpeed ``stage`` into ``config``).
        renamed: argument -> the attribute holding it.
        carried: attributes Lightning derives from arguments, copied as they are.
        refused: argument -> why it has no meaning on the HPU (refused unless left at Lightning's default).
        prevails: attributes the HPU class decides even where the adopted object's class defines them (Ray's device).
    """

    extra: str | None = None
    folded: frozenset[str] = frozenset()
    renamed: Mapping[str, str] = field(default_factory=dict)
    carried: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    prevails: tuple[str, ...] = ("root_device",)


def read_arguments(strategy: object, lightning_cls: Any, adoption: Adoption) -> dict[str, Any]:
    """The arguments ``strategy`` (a ``lightning_cls``) was built with. ``ValueError`` for one refused on the HPU,
    ``RuntimeError`` for one this Lightning stores elsewhere."""
    state = vars(strategy)
    arguments: dict[str, Any] = {}
    for name, parameter in inspect.signature(lightning_cls.__init__).parameters.items():
        if name == "self" or name in adoption.folded or parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            if adoption.extra is not None:
                arguments.update(state[adoption.extra])
            continue
        attribute = adoption.renamed.get(name) or next((a for a in (f"_{name}", name) if a in state), None)
        if attribute is None or attribute not in state:
            raise RuntimeError(
                f"Cannot read the argument {name!r} back from {type(strategy).__name__}: this Lightning keeps it"
                f" elsewhere than lightning_gaudi expects. Pass lightning_gaudi's HPU strategy instead, and report it."
            )
        value = state[attribute]
        reason = adoption.refused.get(name)
        if reason is not None and value is not parameter.default:
            raise ValueError(f"`{name}={value!r}` {reason}")
        arguments[name] = value
    return arguments


def _accepted(hpu_cls: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(hpu_cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return arguments
    return {name: value for name, value in arguments.items() if name in parameters}


@functools.cache
def adopted_class(cls: Any, hpu_cls: Any) -> Any:
    """``cls`` with ``hpu_cls`` under it: ``cls``'s own methods first (but for what ``hpu_cls.adoption.prevails``
    names), then the HPU strategy's, then Lightning's."""
    if issubclass(hpu_cls, cls):  # Lightning's class itself: its HPU stand-in is the class to use
        return hpu_cls
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__reduce__": _reduce}
    for name in hpu_cls.adoption.prevails:
        owner = next((base for base in hpu_cls.__mro__ if name in vars(base)), None)
        if owner is not None and owner.__module__.split(".")[0] == "lightning_gaudi":
            namespace[name] = vars(owner)[name]
    return type(cls.__name__, (cls, hpu_cls), namespace)


def _reduce(self: Any) -> tuple[Any, ...]:
    # the class is made at run time: pickled (a spawned rank) as its two parts and the object's state
    cls = type(self)
    return _rebuild, (cls.__bases__[0], cls.__bases__[1], self.__dict__)


def _rebuild(cls: Any, hpu_cls: Any, state: dict[str, Any]) -> Any:
    adopted = adopted_class(cls, hpu_cls)
    instance = adopted.__new__(adopted)
    instance.__dict__.update(state)
    return instance


def adopt(strategy: Any, hpu_cls: Any, lightning_cls: Any, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """A new strategy of ``strategy``'s class with ``hpu_cls`` under it, built from the arguments read back from
    ``strategy`` (``overrides`` replace some), and those arguments."""
    adoption: Adoption = hpu_cls.adoption
    owner = f"`strategy={type(strategy).__name__}(...)`"
    try:
        read = read_arguments(strategy, lightning_cls, adoption)
        arguments = _accepted(hpu_cls, {**_given(read, lightning_cls), **overrides})
        cls: Any = adopted_class(strategy.__class__, hpu_cls)
        instance = cls.__new__(cls)
        hpu_cls.__init__(instance, **arguments)
    except (ValueError, TypeError) as error:
        raise type(error)(
            f"{owner} runs on HPUs as {hpu_cls.__name__}, which cannot take one of the arguments the object was built"
            f" with: {error}"
        ) from error
    for name, value in vars(strategy).items():
        if name in adoption.carried or name not in instance.__dict__:
            instance.__dict__[name] = value
    return instance, arguments


def _given(arguments: Mapping[str, Any], lightning_cls: Any) -> dict[str, Any]:
    # an argument at Lightning's default was not given: the HPU strategy's default applies, as for a strategy name
    parameters = inspect.signature(lightning_cls.__init__).parameters
    return {
        name: value
        for name, value in arguments.items()
        if name not in parameters or not _same(value, parameters[name].default)
    }


def described(arguments: Mapping[str, Any]) -> str:
    """``arguments`` as ``name=value`` for the start-up line (long values shortened)."""
    texts = {name: repr(value) for name, value in arguments.items() if value is not None}
    return ", ".join(f"{name}={text if len(text) <= 60 else text[:57] + '...'}" for name, text in texts.items())


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return bool(value == default)
    except Exception:  # an object whose == is not a truth value (a tensor)
        return False
