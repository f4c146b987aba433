"""``torch.compile``d modules set up by Fabric get the HPU's compile backend: ``fabric.setup`` compiles a model again
with the arguments Lightning recorded (``_compile_kwargs``); the wrapped ``Fabric.setup``/``setup_module`` fill in the
backend :attr:`Hooks.backend` answers where the user passed none."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_gaudi.patches import registry

_MODULE = "lightning.fabric.fabric"
_CLASS = "Fabric"
WRAPPED = ("setup", "setup_module")
#: Where Lightning records ``torch.compile``'s arguments on the compiled module.
RECORD = "_compile_kwargs"
#: What reads the record in ``Fabric.setup``.
_READER = "lightning.fabric.wrappers._unwrap_compiled"
_MARK = "__lightning_gaudi_compile_hook__"


@dataclass
class Hooks:
    """The policy the wrappers ask: ``backend(strategy)``, the backend for modules set up on ``strategy`` (``None``:
    leave the record)."""

    backend: Callable[[Any], Any] | None = None


HOOKS = Hooks()


def fabric_class() -> type | None:
    """Lightning's ``Fabric``, or ``None`` when this Lightning has none where expected."""
    return registry.find_class(_MODULE, _CLASS)


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    cls = fabric_class()
    missing = [f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED if not callable(getattr(cls, name, None))]
    module, _, name = _READER.rpartition(".")
    reader = getattr(registry.lookup(module, name), "__code__", None)
    if reader is None or RECORD not in reader.co_consts:
        missing.append(f"{_READER} reading {RECORD}")
    return missing


def _with_backend(fabric: Any, module: Any) -> dict[str, Any] | None:
    """The record to use while ``fabric`` sets ``module`` up, or ``None`` to leave it."""
    recorded = getattr(module, RECORD, None)
    if HOOKS.backend is None or not isinstance(recorded, dict) or "backend" in recorded:
        return None
    backend = HOOKS.backend(fabric.strategy)
    return None if backend is None else {**recorded, "backend": backend}


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        filled = _with_backend(self, module)
        if filled is not None:
            setattr(module, RECORD, filled)
        return original(self, module, *args, **kwargs)

    return wrapper


def installed() -> bool:
    """Whether ``Fabric.setup`` and ``Fabric.setup_module`` are wrapped and a policy is set."""
    return HOOKS.backend is not None and registry.wrapped(fabric_class(), WRAPPED, _MARK)


def install() -> bool:
    """Wraps ``Fabric.setup`` and ``Fabric.setup_module`` (idempotent); returns whether the patch is in effect."""
    if installed():
        return True
    fallback = (
        "A model compiled before `fabric.setup` is compiled again with torch's default backend (inductor): pass"
        " `backend=` to torch.compile yourself ('hpu_backend' on a Gaudi)."
    )
    wrappers = dict.fromkeys(WRAPPED, _wrap)
    return registry.wrap_once(fabric_class(), wrappers, _MARK, missing_targets(), fallback) and installed()


PATCH = registry.Patch(
    name="fabric_compile",
    targets=(*(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED), _READER),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
