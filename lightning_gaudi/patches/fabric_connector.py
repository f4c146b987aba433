"""HPU choices in Lightning Fabric's connector (``lightning.fabric.connector._Connector``).

Fabric has its own connector, apart from the Trainer's (:mod:`.connector`). For ``accelerator="hpu"`` Lightning 2.6's
builds ``SingleDeviceStrategy("cpu")`` or its own ``DDPStrategy`` (gloo, no HCCL, no HPU checkpointing) for
``strategy="auto"`` and for ``"ddp"``, turns ``precision="bf16-mixed"`` into CUDA autocast for any accelerator but
cpu/mps (a warning, then fp32), and answers a misspelled strategy name with a list of Lightning's. Seven of its methods
are wrapped so that, for the HPU accelerator only:

- ``_check_config_and_set_final_flags`` refuses an unknown strategy name that starts with ``"hpu"`` (or any unknown
  name with ``accelerator="hpu"``) naming the HPU strategies and the closest one, and a Trainer strategy of this
  package naming its Fabric counterpart;
- ``_choose_auto_accelerator`` picks "hpu" when an HPU (real or emulated) is available;
- ``_set_devices_flag_if_auto_passed`` makes ``devices="auto"`` one device for a single-device strategy;
- ``_choose_strategy`` picks :class:`~lightning_gaudi.fabric.SingleHPUStrategy` for one device and
  ``"hpu_parallel"`` for more (or several nodes);
- ``_check_strategy_and_fallback`` maps Fabric's strategy names onto the Fabric HPU strategies that declare them
  their ``lightning_counterparts`` (the protocol of :mod:`.connector`; ``"ddp"``, ``"ddp_spawn"``,
  ``"ddp_find_unused_parameters_true"`` become :class:`~lightning_gaudi.fabric.HPUParallelStrategy` with the same
  settings), refuses the ones without an HPU version (forking DDP, DP, DeepSpeed, FSDP, XLA) and Lightning's strategy
  instances, naming the HPU strategy to use, and refuses a single-HPU strategy given several devices;
- ``_check_and_init_precision`` checks the precision against the device, lets the strategy choose the plugin
  (``hpu_precision_plugin``, as in :mod:`.connector`), and otherwise makes mixed precision
  :class:`~lightning_gaudi.fabric.HPUPrecision`, autocast on the HPU device type;
- ``_lazy_init_strategy``, which completes the strategy (devices, nodes, cluster environment), is followed by
  :meth:`HPUParallelStrategy.check_launch <lightning_gaudi.fabric.HPUParallelStrategy.check_launch>`, so a bad launch
  fails while Fabric is built, before any process starts.

Every other accelerator goes through Lightning's code unchanged. The wrappers are installed once, only on the
Lightning versions they were checked against; ``tests/patches/test_fabric_connector.py`` fails when Lightning changes
the methods, their order or the attributes the wrappers rely on.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import warnings
from collections.abc import Sequence
from typing import Any

from lightning.fabric.strategies import STRATEGY_REGISTRY, SingleDeviceStrategy, Strategy
from lightning.pytorch.strategies import Strategy as TrainerStrategy

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.patches import registry
from lightning_gaudi.patches.connector import (
    check_lightning_instance,
    is_hpu_strategy_class,
    strategy_from_lightning_name,
    strategy_precision,
)
from lightning_gaudi.precision import check_precision_supported

_MODULE = "lightning.fabric.connector"

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


def _is_hpu_flag(flag: Any) -> bool:
    return flag == "hpu" or isinstance(flag, HPUAccelerator)


def _registered_class(flag: object) -> type | None:
    if isinstance(flag, str) and flag in STRATEGY_REGISTRY:
        found = STRATEGY_REGISTRY[flag]["strategy"]
        return found if isinstance(found, type) else None
    return None


def _is_single_device(flag: object) -> bool:
    from lightning_gaudi.fabric import SingleHPUStrategy

    cls = type(flag) if isinstance(flag, Strategy) else _registered_class(flag)
    return cls is not None and issubclass(cls, (SingleHPUStrategy, SingleDeviceStrategy))


def _hpu_names() -> list[str]:
    names = STRATEGY_REGISTRY.available_strategies()
    return [name for name in names if is_hpu_strategy_class(_registered_class(name) or object)]


def check_strategy_flag(strategy: object, accelerator: object, registered: Sequence[str]) -> None:
    """Refuses, with the fix, a strategy Fabric would refuse with Lightning's generic words (or not at all).

    Args:
        strategy: ``Fabric(strategy=...)``.
        accelerator: ``Fabric(accelerator=...)``.
        registered: the strategy names Fabric knows.

    Raises:
        ValueError: an unknown name that starts with ``"hpu"``, or any unknown name with ``accelerator="hpu"`` (naming
            the HPU strategies and the closest one); a Trainer strategy of ``lightning_gaudi`` (naming its Fabric
            counterpart).
    """
    if isinstance(strategy, str):
        name = strategy.lower()
        if name == "auto" or name in registered or not (name.startswith("hpu") or _is_hpu_flag(accelerator)):
            return
        hpu_names = _hpu_names()
        close = difflib.get_close_matches(name, hpu_names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"`strategy={strategy!r}` is not a strategy Fabric knows. The HPU strategies are"
            f" {', '.join(repr(n) for n in hpu_names)} (or an instance of lightning_gaudi.fabric.SingleHPUStrategy or"
            f" HPUParallelStrategy).{hint}"
        )
    if isinstance(strategy, TrainerStrategy) and type(strategy).__module__.startswith("lightning_gaudi."):
        cls = type(strategy).__name__
        raise ValueError(
            f"`strategy={cls}(...)`: lightning_gaudi.{cls} is the Trainer's strategy. With Fabric use"
            f" lightning_gaudi.fabric.{cls}(...), which takes the same arguments (`precision` where the Trainer's"
            f" takes `precision_plugin`), or its name, {type(strategy).strategy_name!r}."  # type: ignore[attr-defined]
        )


def _check_config_and_set_final_flags(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, strategy: Any, accelerator: Any, precision: Any, plugins: Any) -> Any:
        check_strategy_flag(strategy, accelerator, self._registered_strategies)
        return original(self, strategy, accelerator, precision, plugins)

    return wrapper


def _choose_auto_accelerator(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        if hpu.is_available():
            return "hpu"
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return staticmethod(wrapper)


def _set_devices_flag_if_auto_passed(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        # Lightning makes "auto" every device, which a single-device strategy would silently narrow to one later
        if (
            self._devices_flag == "auto"
            and _is_hpu_flag(self._accelerator_flag)
            and _is_single_device(self._strategy_flag)
        ):
            self._devices_flag = 1
            return
        original(self)

    return wrapper


def _choose_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if not _is_hpu_flag(self._accelerator_flag):
            return original(self)
        # imported here: lightning_gaudi.fabric imports the strategies, which import this package
        from lightning_gaudi.fabric import HPUParallelStrategy, SingleHPUStrategy

        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return HPUParallelStrategy.strategy_name
        return SingleHPUStrategy(device=self._parallel_devices[0] if self._parallel_devices else None)

    return wrapper


def hpu_strategy(flag: str | Strategy, parallel_devices: list[Any], num_nodes: int) -> str | Strategy:
    """The strategy (name or instance) that runs ``Fabric(strategy=flag)`` on HPUs.

    Fabric's DDP names become :class:`~lightning_gaudi.fabric.HPUParallelStrategy` with the same settings
    (``"ddp_find_unused_parameters_true"``: ``HPUParallelStrategy(find_unused_parameters=True)``). HPU strategies,
    and strategies that are neither Lightning's nor derived from its DDP or single-device strategy (a user's own), are
    returned unchanged.

    Args:
        flag: Fabric's ``strategy`` (a name lower-cased, as Lightning does).
        parallel_devices: the devices Fabric selected.
        num_nodes: Fabric's ``num_nodes``.

    Raises:
        ValueError: ``flag`` forks its rank processes, is another Lightning strategy without an HPU version, or is an
            instance of Lightning's DDP or single-device strategy (or of a subclass); or it runs on one HPU while
            Fabric asks for several.
    """
    strategy: str | Strategy = flag
    if isinstance(flag, Strategy):
        check_lightning_instance(flag, STRATEGY_REGISTRY, "lightning_gaudi.fabric")
    else:
        strategy = strategy_from_lightning_name(flag, parallel_devices, STRATEGY_REGISTRY, SingleDeviceStrategy)
    if _is_single_device(strategy) and (len(parallel_devices) > 1 or num_nodes > 1):
        given = f"{type(flag).__name__}(...)" if isinstance(flag, Strategy) else repr(flag)
        raise ValueError(
            f"`strategy={given}` trains on one HPU, but Fabric asks for {len(parallel_devices)} device(s) on"
            f" num_nodes={num_nodes} node(s). Use strategy='hpu_parallel' to train on all of them, or devices=1."
        )
    return strategy


def _check_strategy_and_fallback(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        if _is_hpu_flag(self._accelerator_flag):
            self._strategy_flag = hpu_strategy(self._strategy_flag, self._parallel_devices, self._num_nodes_flag)
        original(self)

    return wrapper


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if self._precision_input == "fp8" and self._precision_instance is None:
            from lightning_gaudi.patches import fp8_precision_name  # it imports this module

            return fp8_precision_name.fabric_plugin(self.accelerator)
        if not isinstance(self.accelerator, HPUAccelerator):
            return original(self)
        from lightning_gaudi.fabric import HPUPrecision, check_precision_plugin

        if self._precision_instance is not None:
            check_precision_plugin(self._precision_instance)
            return original(self)
        check_precision_supported(self._precision_input)
        chosen = strategy_precision(self.strategy, self._precision_input)
        if chosen is not None:
            return chosen
        if self._precision_input in ("bf16-mixed", "16-mixed"):
            return HPUPrecision(self._precision_input)
        return original(self)

    return wrapper


def _lazy_init_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        original(self)
        from lightning_gaudi.fabric import HPUParallelStrategy

        if isinstance(self.strategy, HPUParallelStrategy):
            self.strategy.check_launch()

    return wrapper


_WRAPPERS = {
    "_check_config_and_set_final_flags": _check_config_and_set_final_flags,
    "_choose_auto_accelerator": _choose_auto_accelerator,
    "_set_devices_flag_if_auto_passed": _set_devices_flag_if_auto_passed,
    "_choose_strategy": _choose_strategy,
    "_check_strategy_and_fallback": _check_strategy_and_fallback,
    "_check_and_init_precision": _check_and_init_precision,
    "_lazy_init_strategy": _lazy_init_strategy,
}


def connector_class() -> type | None:
    """Fabric's ``_Connector``, or ``None`` when this Lightning has no such class where expected.

    Looked up when called (not at import), so that a Lightning that moved it still imports ``lightning_gaudi``.
    """
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return None
    found = getattr(module, "_Connector", None)
    return found if isinstance(found, type) else None


def installed() -> bool:
    """Whether the Fabric connector wrappers are in place."""
    connector = connector_class()
    return connector is not None and all(getattr(getattr(connector, name, None), MARK, False) for name in _WRAPPERS)


def install() -> bool:
    """Wraps the connector methods (idempotent). Returns whether the wrappers are installed.

    On a Lightning version outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or one whose
    connector lacks a method the wrappers rely on, nothing is patched and a warning says what still works (HPU strategy
    names and instances, and precision plugins).
    """
    if installed():
        return True
    supported = registry.LIGHTNING_SUPPORTED
    connector = connector_class()
    if connector is None:
        missing = [f"{_MODULE}._Connector"]
    else:
        missing = [name for name in CONNECTOR_ATTRIBUTES if not hasattr(connector, name)]
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" Fabric's connector lacks: {missing or 'nothing'}). Fabric's `strategy='auto'` and precision strings"
            " will not pick HPU classes: pass `strategy='hpu_single'`/'hpu_parallel' and"
            " `plugins=[lightning_gaudi.fabric.HPUPrecision(...)]`.",
            stacklevel=2,
        )
        return False
    assert connector is not None
    for name, make in _WRAPPERS.items():
        original = connector.__dict__[name]
        target = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = make(target)
        setattr(wrapped.__func__ if isinstance(wrapped, staticmethod) else wrapped, MARK, True)
        setattr(connector, name, wrapped)
    return True


PATCH = registry.Patch(
    name="fabric_connector",
    targets=tuple(f"{_MODULE}._Connector.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
