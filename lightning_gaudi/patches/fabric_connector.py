"""Lightning Fabric's connector (``lightning.fabric.connector._Connector``), wrapped so that a routing policy answers
first.

Fabric has its own connector, apart from the Trainer's, with the same five methods (wrapped as in :mod:`.connector`)
and two more:

- ``_check_config_and_set_final_flags``: :meth:`FabricConnectorPolicy.check_flags` sees the flags first (to refuse
  an unknown HPU strategy name with the fix);
- ``_lazy_init_strategy``, which completes the strategy (devices, nodes, cluster environment), is followed by
  :meth:`FabricConnectorPolicy.strategy_built` (to check the launch while Fabric is built, before any process starts).

``tests/patches/test_fabric_connector.py`` builds Fabric objects through the wrappers and fails when Lightning changes
the methods, their order or the attributes the wrappers rely on.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

from lightning_gaudi.patches import registry
from lightning_gaudi.patches.connector import ConnectorPolicy, Hooks, connector_wrappers

_MODULE = "lightning.fabric.connector"
_CLASS = "_Connector"

#: The connector methods replaced by wrappers.
WRAPPED = (
    "_check_config_and_set_final_flags",
    "_choose_auto_accelerator",
    "_set_devices_flag_if_auto_passed",
    "_choose_strategy",
    "_check_strategy_and_fallback",
    "_check_and_init_precision",
    "_lazy_init_strategy",
)
#: The connector attributes the wrappers rely on; checked before installing.
CONNECTOR_ATTRIBUTES = (*WRAPPED, "_init_strategy", "_set_parallel_devices_and_init_accelerator")
#: Connector instance attributes the wrappers read (or, for the strategy and devices flags, set).
INSTANCE_ATTRIBUTES = (
    "_accelerator_flag",
    "_devices_flag",
    "_num_nodes_flag",
    "_parallel_devices",
    "_precision_input",
    "_precision_instance",
    "_registered_strategies",
    "_strategy_flag",
    "accelerator",
    "strategy",
)
#: Set on each wrapper, so that it is installed once.
MARK = "__lightning_gaudi_fabric_hook__"


class FabricConnectorPolicy(ConnectorPolicy, Protocol):
    """A :class:`~.connector.ConnectorPolicy` with Fabric's two more questions."""

    def check_flags(self, strategy: Any, accelerator: Any, registered: Sequence[str]) -> None:
        """Sees ``Fabric(strategy=..., accelerator=...)`` before Lightning checks them (``registered``: the strategy
        names Fabric knows); may raise."""

    def strategy_built(self, strategy: Any) -> None:
        """Sees the strategy once Fabric completed it; may raise."""


HOOKS = Hooks()


def _check_flags(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, strategy: Any, accelerator: Any, precision: Any, plugins: Any) -> Any:
        if HOOKS.policy:
            HOOKS.policy.check_flags(strategy, accelerator, self._registered_strategies)  # type: ignore[attr-defined]
        return original(self, strategy, accelerator, precision, plugins)

    return wrapper


def _strategy_built(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        original(self)
        if HOOKS.policy:
            HOOKS.policy.strategy_built(self.strategy)  # type: ignore[attr-defined]

    return wrapper


def connector_class() -> type | None:
    """Fabric's ``_Connector``, or ``None`` when this Lightning has no such class where expected."""
    found = registry.lookup(_MODULE, _CLASS)
    return found if isinstance(found, type) else None


def installed() -> bool:
    """Whether the wrappers are in place and call a policy."""
    return HOOKS.policy is not None and registry.wrapped(connector_class(), WRAPPED, MARK)


def install() -> bool:
    """Wraps the connector methods (idempotent); they call ``HOOKS.policy``, which :mod:`lightning_gaudi.routing` sets.

    Returns:
        Whether the wrappers are installed and have a policy. On a Lightning outside
        :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or whose connector lacks a method the wrappers
        rely on, nothing is patched and a warning says what still works.
    """
    cls = connector_class()
    missing = [f"{_MODULE}.{_CLASS}"] if cls is None else [a for a in CONNECTOR_ATTRIBUTES if not hasattr(cls, a)]
    fallback = (
        "Fabric's `strategy='auto'` and precision strings will not pick HPU classes: pass `strategy='hpu_single'`/"
        "'hpu_parallel' and `plugins=[lightning_gaudi.fabric.HPUPrecision(...)]`."
    )
    if not registry.supported(missing, fallback):
        return False
    assert cls is not None
    if not registry.wrapped(cls, WRAPPED, MARK):
        wrappers = {
            "_check_config_and_set_final_flags": _check_flags,
            **connector_wrappers(HOOKS, ("_precision_input", "_precision_instance"), None),
            "_lazy_init_strategy": _strategy_built,
        }
        registry.wrap_methods(cls, wrappers, MARK)
    return installed()


PATCH = registry.Patch(
    name="fabric_connector",
    targets=tuple(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
