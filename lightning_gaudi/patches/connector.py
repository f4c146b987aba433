"""The Trainer's accelerator connector (``_AcceleratorConnector``), wrapped so that a routing policy answers first.

Lightning 2.6's connector refuses ``accelerator="hpu"`` with ``strategy="auto"``, builds its own CPU/GPU strategies
for ``"ddp"``, ``"fsdp"``... and turns ``precision="bf16-mixed"`` into CUDA autocast for any accelerator but cpu/mps.
Five of its methods are wrapped; each wrapper reads the connector's private flags, hands them to the
:class:`ConnectorPolicy` in ``HOOKS.policy`` (:mod:`lightning_gaudi.routing` sets it), and leaves every choice
the policy declines to Lightning:

- ``_choose_auto_accelerator``: :meth:`~ConnectorPolicy.auto_accelerator`;
- ``_set_devices_flag_if_auto_passed``: :meth:`~ConnectorPolicy.devices` (``devices="auto"`` for one device);
- ``_choose_strategy``: :meth:`~ConnectorPolicy.choose_strategy` (``strategy="auto"``);
- ``_check_strategy_and_fallback``: :meth:`~ConnectorPolicy.check_strategy` (Lightning's names and instances);
- ``_check_and_init_precision``: :meth:`~ConnectorPolicy.precision`.

Fabric's connector is wrapped the same way (:mod:`.fabric_connector`). ``tests/patches/test_connector.py`` builds
Trainers through the wrappers and fails when Lightning changes the methods, their order or the attributes read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from lightning_gaudi.patches import registry

_MODULE = "lightning.pytorch.trainer.connectors.accelerator_connector"
_CLASS = "_AcceleratorConnector"
#: The connector methods replaced by wrappers.
WRAPPED = (
    "_choose_auto_accelerator",
    "_set_devices_flag_if_auto_passed",
    "_choose_strategy",
    "_check_strategy_and_fallback",
    "_check_and_init_precision",
)
#: The connector attributes the wrappers rely on; checked before installing.
_VALIDATE = "_validate_precision_choice"
CONNECTOR_ATTRIBUTES = (*WRAPPED, _VALIDATE)
#: Connector instance attributes the wrappers read (or, for the strategy and devices flags, set).
INSTANCE_ATTRIBUTES = (
    "_accelerator_flag",
    "_devices_flag",
    "_num_nodes_flag",
    "_parallel_devices",
    "_precision_flag",
    "_precision_plugin_flag",
    "_strategy_flag",
    "accelerator",
)
_MARK = "__lightning_gaudi_hook__"


class ConnectorPolicy(Protocol):
    """What the wrappers of a connector (the Trainer's or Fabric's) ask; ``None`` leaves the choice to Lightning."""

    def auto_accelerator(self) -> str | None:
        """The accelerator ``accelerator="auto"`` picks."""

    def devices(self, accelerator: Any, strategy: Any, devices: Any) -> Any:
        """The devices flag instead of ``"auto"`` (called only for ``devices="auto"``)."""

    def choose_strategy(self, accelerator: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        """The strategy (name or instance) ``strategy="auto"`` picks."""

    def check_strategy(self, accelerator: Any, strategy: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        """The strategy flag to build instead of ``strategy`` (``strategy`` itself to keep it); may raise."""

    def precision(
        self, accelerator: Any, strategy: Any, precision: Any, plugin: Any, validate: Callable[[], None]
    ) -> Any:
        """The precision plugin for ``precision`` (``plugin``: the one given, or ``None``); ``validate()`` runs
        Lightning's check of the choice."""


class Hooks:
    """The policy the wrappers of one connector call; with none, they leave everything to Lightning."""

    def __init__(self) -> None:
        self.policy: ConnectorPolicy | None = None


def connector_wrappers(
    hooks: Hooks, precision_attributes: tuple[str, str], validate: str | None
) -> dict[str, Callable[[Any], Any]]:
    """The wrappers of the five methods both connectors share, calling ``hooks.policy``.

    Args:
        hooks: where the policy is found when a wrapper runs.
        precision_attributes: the connector's (precision flag, precision plugin) attributes.
        validate: the connector's method validating a precision choice, if it has one.
    """

    def auto_accelerator(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chosen = hooks.policy.auto_accelerator() if hooks.policy else None
            return original(*args, **kwargs) if chosen is None else chosen

        return wrapper

    def devices(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any) -> None:
            chosen = None
            if hooks.policy and self._devices_flag == "auto":
                chosen = hooks.policy.devices(self._accelerator_flag, self._strategy_flag, self._devices_flag)
            if chosen is None:
                original(self)
            else:
                self._devices_flag = chosen

        return wrapper

    def choose_strategy(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any) -> Any:
            chosen = None
            if hooks.policy:
                chosen = hooks.policy.choose_strategy(
                    self._accelerator_flag, self._parallel_devices, self._num_nodes_flag
                )
            return original(self) if chosen is None else chosen

        return wrapper

    def check_strategy(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any) -> None:
            if hooks.policy:
                self._strategy_flag = hooks.policy.check_strategy(
                    self._accelerator_flag, self._strategy_flag, self._parallel_devices, self._num_nodes_flag
                )
            original(self)

        return wrapper

    def precision(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any) -> Any:
            chosen = None
            if hooks.policy:
                flag, plugin = (getattr(self, name) for name in precision_attributes)
                check = getattr(self, validate) if validate else lambda: None
                chosen = hooks.policy.precision(self.accelerator, self.strategy, flag, plugin, check)
            return original(self) if chosen is None else chosen

        return wrapper

    return {
        "_choose_auto_accelerator": auto_accelerator,
        "_set_devices_flag_if_auto_passed": devices,
        "_choose_strategy": choose_strategy,
        "_check_strategy_and_fallback": check_strategy,
        "_check_and_init_precision": precision,
    }


HOOKS = Hooks()


def connector_class() -> type | None:
    """Lightning's ``_AcceleratorConnector``, or ``None`` when this Lightning has no such class where expected."""
    found = registry.lookup(_MODULE, _CLASS)
    return found if isinstance(found, type) else None


def installed() -> bool:
    """Whether the wrappers are in place and call a policy."""
    return HOOKS.policy is not None and registry.wrapped(connector_class(), WRAPPED, _MARK)


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
        "`strategy='auto'` and precision strings will not pick HPU classes: pass `strategy='hpu_single'`/"
        "'hpu_parallel' and `plugins=[HPUPrecision(...)]`."
    )
    if not registry.supported(missing, fallback):
        return False
    assert cls is not None
    if not registry.wrapped(cls, WRAPPED, _MARK):
        wrappers = connector_wrappers(HOOKS, ("_precision_flag", "_precision_plugin_flag"), _VALIDATE)
        registry.wrap_methods(cls, wrappers, _MARK)
    return installed()


PATCH = registry.Patch(
    name="connector",
    targets=tuple(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
