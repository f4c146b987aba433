"""Fabric's ``_Connector``, wrapped as the Trainer's is (:mod:`.connector`) so that a routing policy answers first."""

from __future__ import annotations

from lightning_gaudi.patches import registry
from lightning_gaudi.patches.connector import WRAPPED, Hooks, connector_wrappers, missing_attributes

_MODULE = "lightning.fabric.connector"
_CLASS = "_Connector"
CONNECTOR_ATTRIBUTES = (*WRAPPED, "_init_strategy", "_set_parallel_devices_and_init_accelerator", "_lazy_init_strategy")
#: Connector instance attributes the wrappers read (or set).
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
MARK = "__lightning_gaudi_fabric_hook__"
HOOKS = Hooks()


def connector_class() -> type | None:
    """Fabric's ``_Connector``, or ``None`` when this Lightning has no such class where expected."""
    return registry.find_class(_MODULE, _CLASS)


def installed() -> bool:
    """Whether the wrappers are in place and call a policy."""
    return HOOKS.policy is not None and registry.wrapped(connector_class(), WRAPPED, MARK)


def install() -> bool:
    """Wraps the connector methods (idempotent), as :func:`.connector.install` does."""
    fallback = (
        "Fabric's `strategy='auto'` and precision strings will not pick HPU classes: pass `strategy='hpu_single'`/"
        "'hpu_parallel' and `plugins=[lightning_gaudi.fabric.HPUPrecision(...)]`."
    )
    cls = connector_class()
    missing = missing_attributes(cls, f"{_MODULE}.{_CLASS}", CONNECTOR_ATTRIBUTES)
    wrappers = connector_wrappers(HOOKS, ("_precision_input", "_precision_instance"), None)
    return registry.wrap_once(cls, wrappers, MARK, missing, fallback) and installed()


PATCH = registry.Patch(
    name="fabric_connector",
    targets=tuple(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
