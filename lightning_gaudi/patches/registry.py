"""What a patch is, the upstream versions the patches were checked against, and the helpers the shims share."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_utilities.core.imports import RequirementCache

#: The lowest versions the patches were tested on (docs/compat.md); no upper cap: a newer one keeps a patch on wherever
#: what it relies on is still there (each patch's ``missing_targets()``, probed at install).
SUPPORTED_LIGHTNING = "lightning>=2.5.6"
SUPPORTED_TORCH = "torch>=2.7"

#: Truthy when the installed Lightning is in :data:`SUPPORTED_LIGHTNING`; ``.message`` says why not otherwise.
LIGHTNING_SUPPORTED = RequirementCache(SUPPORTED_LIGHTNING)
#: Truthy when the installed torch is at least :data:`SUPPORTED_TORCH`.
TORCH_SUPPORTED = RequirementCache(SUPPORTED_TORCH)


@dataclass(frozen=True)
class Patch:
    """One patch: its registry key, the upstream objects it replaces or relies on (dotted paths), the versions it was
    checked against, ``install`` (idempotent; on an unsupported version patches nothing and warns) and ``installed``."""

    name: str
    targets: tuple[str, ...]
    requirement: str
    install: Callable[[], bool]
    installed: Callable[[], bool]


def lookup(module: str, name: str | None = None) -> Any:
    """The module (or its attribute ``name``), looked up when called; ``None`` when this upstream version lacks it."""
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return None
    return found if name is None else getattr(found, name, None)


def find_class(module: str, name: str) -> type | None:
    """The class ``module.name``, or ``None`` where this upstream version has none."""
    found = lookup(module, name)
    return found if isinstance(found, type) else None


def supported(missing: list[str], fallback: str, torch: bool = False) -> bool:
    """Whether a patch may be installed (the version in the checked range, nothing ``missing``); otherwise warns,
    naming both and ``fallback`` (what still works)."""
    requirement, cache = (SUPPORTED_TORCH, TORCH_SUPPORTED) if torch else (SUPPORTED_LIGHTNING, LIGHTNING_SUPPORTED)
    if cache and not missing:
        return True
    warnings.warn(
        f"lightning_gaudi was checked against {requirement} ({cache.message or 'ok'}; missing:"
        f" {missing or 'nothing'}). {fallback}",
        stacklevel=3,
    )
    return False


def wrap_methods(cls: type, wrappers: Mapping[str, Callable[[Any], Any]], mark: str) -> None:
    """Replaces each method ``name`` of ``cls`` by ``wrappers[name](method)``, marked with ``mark`` (a static method
    stays one)."""
    for name, make in wrappers.items():
        original = cls.__dict__[name]
        static = isinstance(original, staticmethod)
        wrapper = make(original.__func__ if static else original)
        setattr(wrapper, mark, True)
        setattr(cls, name, staticmethod(wrapper) if static else wrapper)


def wrapped(cls: type | None, names: Iterable[str], mark: str) -> bool:
    """Whether every method ``names`` of ``cls`` is a wrapper marked with ``mark``."""
    return cls is not None and all(getattr(getattr(cls, name, None), mark, False) for name in names)


def wrap_once(
    cls: type | None, wrappers: Mapping[str, Callable[[Any], Any]], mark: str, missing: list[str], fallback: str
) -> bool:
    """Wraps ``cls``'s methods with ``wrappers`` once unless :func:`supported` says no (warning ``fallback``);
    returns whether they are wrapped."""
    if not supported(missing, fallback):
        return False
    assert cls is not None  # missing names it otherwise
    if not wrapped(cls, wrappers, mark):
        wrap_methods(cls, wrappers, mark)
    return True
