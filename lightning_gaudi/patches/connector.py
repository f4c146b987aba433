"""The Trainer's ``_AcceleratorConnector``, wrapped so that a routing policy (``HOOKS.policy``) answers first:
Lightning's refuses ``accelerator="hpu"`` with ``strategy="auto"``, builds CPU/GPU strategies for ``"ddp"``... and
autocasts on CUDA. Every choice the policy declines is Lightning's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_gaudi.patches import registry

_MODULE = "lightning.pytorch.trainer.connectors.accelerator_connector"
_CLASS = "_AcceleratorConnector"
WRAPPED = (
    "_check_config_and_set_final_flags",
    "_choose_auto_accelerator",
    "_set_devices_flag_if_auto_passed",
    "_choose_strategy",
    "_check_strategy_and_fallback",
    "_check_and_init_precision",
)
_VALIDATE = "_validate_precision_choice"
CONNECTOR_ATTRIBUTES = (*WRAPPED, _VALIDATE)
#: Connector instance attributes the wrappers read (or set).
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

    def check_flags(self, strategy: Any, accelerator: Any, registered: Sequence[str]) -> None:
        """Sees the ``strategy`` and ``accelerator`` flags before Lightning checks them; may raise."""

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


@dataclass
class Hooks:
    """The policy the wrappers of one connector call; with none, they leave everything to Lightning."""

    policy: ConnectorPolicy | None = None


def connector_wrappers(
    hooks: Hooks, precision_attributes: tuple[str, str], validate: str | None
) -> dict[str, Callable[[Any], Any]]:
    """The wrappers of the six methods both connectors share, calling ``hooks.policy``; ``precision_attributes``
    names the connector's precision flag and plugin, ``validate`` its method checking a precision choice."""

    def answer(ask: Callable[..., Any]) -> Callable[[Any], Any]:
        # a wrapper returning the policy's answer, `ask(policy, *args)`, else what the original method returns
        def make(original: Any) -> Any:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                chosen = ask(hooks.policy, *args) if hooks.policy else None
                return original(*args, **kwargs) if chosen is None else chosen

            return wrapper

        return make

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

    def check_flags(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any, strategy: Any, accelerator: Any, *args: Any, **kwargs: Any) -> Any:
            if hooks.policy:
                hooks.policy.check_flags(strategy, accelerator, self._registered_strategies)
            return original(self, strategy, accelerator, *args, **kwargs)

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

    def precision(policy: ConnectorPolicy, self: Any) -> Any:
        flag, plugin = (getattr(self, name) for name in precision_attributes)
        check = getattr(self, validate) if validate else lambda: None
        return policy.precision(self.accelerator, self.strategy, flag, plugin, check)

    def strategy(policy: ConnectorPolicy, self: Any) -> Any:
        return policy.choose_strategy(self._accelerator_flag, self._parallel_devices, self._num_nodes_flag)

    return {
        "_check_config_and_set_final_flags": check_flags,
        "_choose_auto_accelerator": answer(lambda policy, *_: policy.auto_accelerator()),
        "_set_devices_flag_if_auto_passed": devices,
        "_choose_strategy": answer(strategy),
        "_check_strategy_and_fallback": check_strategy,
        "_check_and_init_precision": answer(precision),
    }


HOOKS = Hooks()


def connector_class() -> type | None:
    """Lightning's ``_AcceleratorConnector``, or ``None`` when this Lightning has no such class where expected."""
    return registry.find_class(_MODULE, _CLASS)


def missing_attributes(cls: type | None, where: str, attributes: tuple[str, ...]) -> list[str]:
    """What of ``attributes`` the connector ``cls`` (at ``where``) lacks; ``[where]`` without it."""
    return [where] if cls is None else [a for a in attributes if not hasattr(cls, a)]


def installed() -> bool:
    """Whether the wrappers are in place and call a policy."""
    return HOOKS.policy is not None and registry.wrapped(connector_class(), WRAPPED, _MARK)


def install() -> bool:
    """Wraps the connector methods (idempotent); returns whether they are wrapped and have a policy, else warns."""
    fallback = (
        "`strategy='auto'` and precision strings will not pick HPU classes: pass `strategy='hpu_single'`/"
        "'hpu_parallel' and `plugins=[HPUPrecision(...)]`."
    )
    cls = connector_class()
    missing = missing_attributes(cls, f"{_MODULE}.{_CLASS}", CONNECTOR_ATTRIBUTES)
    wrappers = connector_wrappers(HOOKS, ("_precision_flag", "_precision_plugin_flag"), _VALIDATE)
    return registry.wrap_once(cls, wrappers, _MARK, missing, fallback) and installed()


PATCH = registry.Patch(
    name="connector",
    targets=tuple(f"{_MODULE}.{_CLASS}.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
