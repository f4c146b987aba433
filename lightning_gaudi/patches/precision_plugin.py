"""Overriding a method on one live Lightning precision plugin, and restoring it.

Two callbacks change what the Trainer's precision plugin does for the run they are in, without replacing the plugin:
:class:`~lightning_gaudi.callbacks.FusedOptimizers` makes ``clip_grad_by_norm`` use the fused clipper and
:class:`~lightning_gaudi.callbacks.BF16Autocast` wraps ``autocast_context_manager`` in its op lists. They rely on
Lightning calling these methods through the instance:

- ``Precision._clip_gradients`` -> ``LightningModule.configure_gradient_clipping`` -> ``Precision.clip_gradients``
  -> ``self.clip_grad_by_norm(optimizer, clip_val)``;
- ``MixedPrecision.forward_context`` -> ``self.autocast_context_manager()``.

:func:`override_method` checks that the plugin's class still defines the method with those parameters and returns an
:class:`Override` whose :meth:`~Override.restore` puts the class's method back. ``tests/patches/
test_precision_plugin.py`` fails when Lightning changes the methods or the call path.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from lightning.pytorch.plugins import precision as lightning_precision

from lightning_gaudi.patches import registry

_PRECISION = lightning_precision.__name__

#: The methods that may be overridden: the Lightning class that defines each, and its parameters after ``self``.
OVERRIDABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "clip_grad_by_norm": ("Precision", ("optimizer", "clip_val")),
    "autocast_context_manager": ("MixedPrecision", ()),
}
_MISSING = object()


class _State:
    enabled = False


def _parameters(method: Any) -> tuple[str, ...] | None:
    if not inspect.isfunction(method):
        return None
    return tuple(inspect.signature(method).parameters)[1:]


def _owner(class_name: str) -> type | None:
    found = getattr(lightning_precision, class_name, None)
    return found if isinstance(found, type) else None


def missing_targets() -> list[str]:
    """What the overrides rely on and this Lightning lacks or changed (empty when everything is as checked)."""
    missing = []
    for name, (class_name, expected) in OVERRIDABLE.items():
        owner = _owner(class_name)
        if owner is None:
            missing.append(f"{_PRECISION}.{class_name}")
        elif _parameters(owner.__dict__.get(name)) != expected:
            missing.append(f"{_PRECISION}.{class_name}.{name}(self, {', '.join(expected)})")
    return missing


def installed() -> bool:
    """Whether :func:`override_method` was checked against this Lightning and may override."""
    return _State.enabled


def install() -> bool:
    """Checks Lightning's precision plugins (idempotent). Returns whether :func:`override_method` is enabled.

    On a Lightning version outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or whose plugins
    changed these methods, a warning says what still works.
    """
    if _State.enabled:
        return True
    supported = registry.LIGHTNING_SUPPORTED
    missing = missing_targets()
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" missing: {missing or 'nothing'}). FusedOptimizers will leave gradient clipping to Lightning (torch's"
            " clip_grad_norm_) and BF16Autocast cannot apply op lists under emulation; everything else works.",
            stacklevel=2,
        )
        return False
    _State.enabled = True
    return True


class Override:
    """An overridden method on one plugin instance; :meth:`restore` undoes it.

    Attributes:
        plugin: the precision plugin instance.
        name: the overridden method's name.
        function: what ``plugin.<name>`` now is.
    """

    def __init__(self, plugin: Any, name: str, function: Callable[..., Any]) -> None:
        self.plugin = plugin
        self.name = name
        self.function = function
        self._previous = vars(plugin).get(name, _MISSING)
        setattr(plugin, name, function)
        self._active = True

    @property
    def active(self) -> bool:
        """Whether the override is in place (not restored yet)."""
        return self._active

    def restore(self) -> None:
        """Puts back what ``plugin.<name>`` was before (the class's method, normally). Safe to call twice."""
        if not self._active:
            return
        self._active = False
        if self._previous is _MISSING:
            if vars(self.plugin).get(self.name) is self.function:
                delattr(self.plugin, self.name)
        else:
            setattr(self.plugin, self.name, self._previous)


def override_method(plugin: Any, name: str, function: Callable[..., Any]) -> Override:
    """Makes ``plugin.<name>`` be ``function`` on this plugin instance only, until ``restore()`` is called.

    Args:
        plugin: a Lightning precision plugin, e.g. ``trainer.precision_plugin``.
        name: one of :data:`OVERRIDABLE` (``"clip_grad_by_norm"``, ``"autocast_context_manager"``).
        function: the replacement, called with the method's parameters (without ``self``).

    Returns:
        The override; call its :meth:`~Override.restore` at teardown.

    Raises:
        ValueError: ``name`` is not overridable, or ``function`` does not take the method's parameters.
        TypeError: ``plugin`` is not an instance of the Lightning class that defines ``name``, or its class
            redefines ``name`` with other parameters.
        RuntimeError: this Lightning was not checked (:func:`installed` is false).
    """
    if name not in OVERRIDABLE:
        raise ValueError(f"override_method cannot override {name!r}; it overrides {', '.join(OVERRIDABLE)}.")
    class_name, expected = OVERRIDABLE[name]
    if not installed():
        raise RuntimeError(
            f"lightning_gaudi overrides `{class_name}.{name}` only on {registry.SUPPORTED_LIGHTNING} whose plugins"
            f" are as checked (missing or changed: {missing_targets() or 'nothing'};"
            f" {registry.LIGHTNING_SUPPORTED.message or 'version ok'})."
        )
    owner = _owner(class_name)
    if owner is None or not isinstance(plugin, owner):
        raise TypeError(
            f"Overriding `{name}` needs a Lightning `{class_name}` plugin, not {type(plugin).__qualname__}."
        )
    if _parameters(getattr(type(plugin), name, None)) != expected:
        raise TypeError(
            f"{type(plugin).__qualname__}.{name} does not take ({', '.join(expected)}) as Lightning's"
            f" {class_name}.{name} does; it cannot be overridden."
        )
    try:
        inspect.signature(function).bind(*expected)
    except TypeError as error:
        raise ValueError(f"The replacement for `{name}` must take ({', '.join(expected)}): {error}.") from None
    return Override(plugin, name, function)


PATCH = registry.Patch(
    name="precision_plugin",
    targets=tuple(f"{_PRECISION}.{cls}.{name}" for name, (cls, _) in OVERRIDABLE.items()),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
