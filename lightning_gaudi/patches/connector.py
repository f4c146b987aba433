"""HPU choices in Lightning's accelerator connector (``_AcceleratorConnector``).

Lightning 2.6's accelerator connector refuses ``accelerator="hpu"`` with ``strategy="auto"``, builds its own
``DDPStrategy`` (gloo, no HCCL, no HPU checkpointing) for ``strategy="ddp"`` and its variants (its CUDA-only FSDP and
DeepSpeed strategies for theirs), and turns ``precision="bf16-mixed"`` into CUDA autocast for any accelerator but
cpu/mps. Five of its methods are wrapped so that, for the HPU accelerator only:

- ``_choose_auto_accelerator`` picks "hpu" when an HPU (real or emulated) is available;
- ``_set_devices_flag_if_auto_passed`` makes ``devices="auto"`` one device for a single-device strategy;
- ``_choose_strategy`` picks "hpu_single" for one device and "hpu_parallel" for more (or several nodes);
- ``_check_strategy_and_fallback`` maps Lightning's strategy names onto the HPU strategies that stand in for them
  (see below), refuses the ones without an HPU stand-in (forking DDP, XLA...) and instances of Lightning's strategies,
  naming the HPU strategy to use, and refuses a single-HPU strategy given several devices;
- ``_check_and_init_precision`` checks the precision against the device, lets the strategy choose the plugin (see
  below), and otherwise makes mixed precision autocast on the HPU device type.

The protocol between the HPU strategies and the connectors (this one and Fabric's, :mod:`.fabric_connector`):

- **Lightning counterparts.** An HPU strategy class may declare ``lightning_counterparts: ClassVar[tuple[type[Strategy],
  ...]]``, the Lightning strategy classes it stands in for (``HPUParallelStrategy``: ``(DDPStrategy,)``,
  ``SingleHPUStrategy``: ``(SingleDeviceStrategy,)``, ``HPUFSDPStrategy``: ``(FSDPStrategy,)``...). Only a class's own
  declaration counts, not an inherited one, and the class must be in the strategy registry. With
  ``accelerator="hpu"``, a Lightning registry name whose class is such a counterpart becomes the HPU class built with
  the registry's ``init_params`` (``"ddp_find_unused_parameters_true"``: ``HPUParallelStrategy(start_method='popen',
  find_unused_parameters=True)``; ``"fsdp_cpu_offload"``: ``HPUFSDPStrategy(cpu_offload=True)``;
  ``"deepspeed_stage_2"``: ``HPUDeepSpeedStrategy(stage=2)``), with an info line; a name whose ``start_method``
  forks is refused (a forked child cannot take over its parent's HPU); ``"single_device"`` gets the selected device.
  An instance of a counterpart class (or of a user's subclass of one) is refused with an error naming the HPU class.
  A Lightning name or instance no HPU class claims is refused, naming ``"hpu_parallel"`` and ``"hpu_single"``.
- **Precision.** When no precision plugin is given, ``_check_and_init_precision`` first asks the strategy: a strategy
  with a method ``hpu_precision_plugin(precision: str) -> Precision | None`` gets the precision string (already
  checked against the device), and a result other than ``None`` is the plugin (FSDP needs its own, autocasting on the
  HPU device type; DeepSpeed needs ``DeepSpeedPrecision``).

Every other accelerator goes through Lightning's code unchanged. The wrappers are installed once, only on the
Lightning versions they were checked against; ``tests/patches/test_connector.py`` fails when Lightning changes
the methods or attributes they rely on.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.patches import registry
from lightning_gaudi.precision import HPUPrecision, check_precision_supported

_MODULE = "lightning.pytorch.trainer.connectors.accelerator_connector"

#: The connector attributes the wrappers read; checked before installing.
CONNECTOR_ATTRIBUTES = (
    "_choose_auto_accelerator",
    "_set_devices_flag_if_auto_passed",
    "_choose_strategy",
    "_check_strategy_and_fallback",
    "_check_and_init_precision",
    "_validate_precision_choice",
)
#: The connector methods replaced by wrappers.
WRAPPED = (
    "_choose_auto_accelerator",
    "_set_devices_flag_if_auto_passed",
    "_choose_strategy",
    "_check_strategy_and_fallback",
    "_check_and_init_precision",
)
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


def _is_hpu_flag(flag: Any) -> bool:
    return flag == "hpu" or isinstance(flag, HPUAccelerator)


def _choose_auto_accelerator(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        if hpu.is_available():
            return "hpu"
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return staticmethod(wrapper)


def _choose_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if not _is_hpu_flag(self._accelerator_flag):
            return original(self)
        # Lazy: the strategies import lightning_gaudi.patches.loops, so importing them here at module level
        # would make the strategies and this package an import cycle.
        from lightning_gaudi.strategies import HPUParallelStrategy, SingleHPUStrategy

        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return HPUParallelStrategy.strategy_name
        return SingleHPUStrategy(device=self._parallel_devices[0] if self._parallel_devices else None)

    return wrapper


def _registered_class(flag: object) -> type | None:
    if isinstance(flag, str) and flag in StrategyRegistry:
        found = StrategyRegistry[flag]["strategy"]
        return found if isinstance(found, type) else None
    return None


def _is_lightnings(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric")


def _is_single_device(flag: object) -> bool:
    from lightning_gaudi.strategies import SingleHPUStrategy

    cls = type(flag) if isinstance(flag, Strategy) else _registered_class(flag)
    return cls is not None and issubclass(cls, (SingleHPUStrategy, SingleDeviceStrategy))


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


_USE_HPU_STRATEGIES = "strategy='hpu_parallel' (DDP over HCCL, one process per card) or 'hpu_single'"
#: The attribute an HPU strategy class declares to stand in for Lightning strategy classes (see the module docstring).
COUNTERPARTS_ATTRIBUTE = "lightning_counterparts"
#: The method a strategy may define to choose the precision plugin for a precision string on HPUs.
PRECISION_HOOK = "hpu_precision_plugin"


def claimed_counterparts(cls: type) -> tuple[type, ...]:
    """The Lightning strategy classes ``cls`` itself declares it stands in for (inherited declarations do not count,
    so a user's subclass of an HPU strategy never takes over Lightning's names)."""
    declared = vars(cls).get(COUNTERPARTS_ATTRIBUTE, ())
    return tuple(declared) if isinstance(declared, (tuple, list)) else ()


def is_hpu_strategy_class(cls: type) -> bool:
    """Whether ``cls`` is (or derives from) a strategy declaring Lightning counterparts, i.e. knows the HPU."""
    return any(claimed_counterparts(base) for base in cls.__mro__)


def hpu_counterpart(lightning_cls: type, strategy_registry: dict[str, Any]) -> type | None:
    """The strategy class registered in ``strategy_registry`` that declares ``lightning_cls`` exactly among its
    ``lightning_counterparts``, or ``None``.

    Args:
        lightning_cls: a Lightning strategy class (the Trainer's or Fabric's).
        strategy_registry: the Trainer's ``StrategyRegistry`` or Fabric's ``STRATEGY_REGISTRY``.
    """
    for entry in strategy_registry.values():
        found = entry.get("strategy")
        if isinstance(found, type) and lightning_cls in claimed_counterparts(found):
            return found
    return None


def check_lightning_instance(strategy: object, strategy_registry: dict[str, Any], package: str) -> None:
    """Refuses an instance of a Lightning strategy (or of a user's subclass of one) that has an HPU stand-in, and any
    other Lightning strategy instance, naming the HPU strategy to use. HPU strategies, and a user's own strategies
    deriving from no Lightning class with an HPU stand-in, pass.

    Args:
        strategy: the ``strategy`` flag, an instance.
        strategy_registry: where the HPU strategies are registered.
        package: where the HPU classes live, for the message ("lightning_gaudi" or "lightning_gaudi.fabric").

    Raises:
        ValueError: see above.
    """
    cls = type(strategy)
    if is_hpu_strategy_class(cls):
        return
    if _is_lightnings(cls):
        hpu_cls = hpu_counterpart(cls, strategy_registry)
        if hpu_cls is None:
            fix = f"use {_USE_HPU_STRATEGIES}"
        else:
            fix = f"pass {package}'s `{hpu_cls.__name__}(...)` instead, which takes the same arguments"
    else:
        found = next(
            (
                (base, hpu_cls)
                for base in cls.__mro__[1:]
                if _is_lightnings(base) and (hpu_cls := hpu_counterpart(base, strategy_registry)) is not None
            ),
            None,
        )
        if found is None:
            return  # a user's own strategy: it may well know the HPU
        fix = f"subclass {package}'s {found[1].__name__} instead of {found[0].__name__}"
    raise ValueError(
        f"`strategy={cls.__name__}(...)` does not run on HPUs: it sets up neither the HPU, nor HCCL collectives, nor"
        f" HPU checkpointing. With accelerator='hpu', {fix}."
    )


def strategy_from_lightning_name(
    name: str, parallel_devices: list[Any], strategy_registry: dict[str, Any], single_device: type
) -> str | Any:
    """The HPU strategy that stands in for the Lightning strategy registered as ``name``, built with the registry's
    ``init_params`` (``"deepspeed_stage_2"``: ``HPUDeepSpeedStrategy(stage=2)``); other names unchanged.

    Args:
        name: a strategy name (lower-cased, as Lightning does).
        parallel_devices: the devices selected; a single-device strategy takes the first.
        strategy_registry: the Trainer's ``StrategyRegistry`` or Fabric's ``STRATEGY_REGISTRY``.
        single_device: Lightning's single-device strategy class of that API (its stand-in gets the device).

    Raises:
        ValueError: ``name`` forks its rank processes, or is a Lightning strategy without an HPU stand-in.
    """
    entry = dict.get(strategy_registry, name)  # the registry's own get() builds a strategy
    cls = entry["strategy"] if entry is not None else None
    if not isinstance(cls, type) or not _is_lightnings(cls):
        return name
    hpu_cls = hpu_counterpart(cls, strategy_registry)
    if hpu_cls is None:
        raise ValueError(f"`strategy={name!r}` ({cls.__name__}) does not run on HPUs. Use {_USE_HPU_STRATEGIES}.")
    assert entry is not None
    init_params = dict(entry["init_params"])
    if cls is single_device:
        init_params.setdefault("device", parallel_devices[0] if parallel_devices else None)
        return hpu_cls(**init_params)
    # imported here: the strategies import this package (see _choose_strategy)
    from lightning_gaudi.strategies._shared import START_METHODS

    start_method = init_params.get("start_method")
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(
            f"`strategy={name!r}` forks its rank processes; {hpu_cls.__name__} starts them with 'popen' or 'spawn'"
            " only (a forked child cannot take over its parent's HPU). Use strategy='hpu_parallel' (each rank re-runs"
            " the script) or 'hpu_parallel_spawn'; in a notebook, run the training as a script."
        )
    settings = ", ".join(f"{key}={value!r}" for key, value in init_params.items())
    rank_zero_info(f"`strategy={name!r}` with accelerator='hpu': training with {hpu_cls.__name__}({settings}).")
    return hpu_cls(**init_params)


def hpu_strategy(flag: str | Strategy, parallel_devices: list[Any], num_nodes: int) -> str | Strategy:
    """The strategy (name or instance) that runs the Trainer's ``strategy=flag`` on HPUs.

    Lightning's DDP names become :class:`~lightning_gaudi.strategies.HPUParallelStrategy` with the same settings
    (``"ddp_find_unused_parameters_true"``: ``HPUParallelStrategy(find_unused_parameters=True)``), ``"single_device"``
    becomes :class:`~lightning_gaudi.strategies.SingleHPUStrategy`. HPU strategies, and strategies that are neither
    Lightning's nor derived from its DDP or single-device strategy (a user's own), are returned unchanged.

    Args:
        flag: the Trainer's ``strategy`` (a name lower-cased, as Lightning does).
        parallel_devices: the devices the Trainer selected.
        num_nodes: the Trainer's ``num_nodes``.

    Raises:
        ValueError: ``flag`` forks its rank processes, is another Lightning strategy without an HPU version, or is an
            instance of Lightning's DDP or single-device strategy (or of a subclass); or it trains on one HPU while
            the Trainer asks for several.
    """
    strategy: str | Strategy = flag
    if isinstance(flag, Strategy):
        check_lightning_instance(flag, StrategyRegistry, "lightning_gaudi")
    else:
        strategy = strategy_from_lightning_name(flag, parallel_devices, StrategyRegistry, SingleDeviceStrategy)
    if _is_single_device(strategy) and (len(parallel_devices) > 1 or num_nodes > 1):
        given = f"{type(flag).__name__}(...)" if isinstance(flag, Strategy) else repr(flag)
        raise ValueError(
            f"`strategy={given}` trains on one HPU, but the Trainer asks for {len(parallel_devices)} device(s) on"
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


def strategy_precision(strategy: object, precision: str) -> Any:
    """The precision plugin ``strategy`` chooses for ``precision`` through its ``hpu_precision_plugin`` method, or
    ``None`` (no such method, or it leaves the choice to the connector)."""
    choose = getattr(strategy, PRECISION_HOOK, None)
    return choose(precision) if callable(choose) else None


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if self._precision_flag == "fp8" and self._precision_plugin_flag is None:
            from lightning_gaudi.patches import fp8_precision_name  # it imports this module

            return fp8_precision_name.trainer_plugin(self.accelerator, self.strategy)
        if not isinstance(self.accelerator, HPUAccelerator):
            return original(self)
        if self._precision_plugin_flag is not None:
            check_precision_supported(self._precision_plugin_flag)
            return original(self)
        check_precision_supported(self._precision_flag)
        chosen = strategy_precision(self.strategy, self._precision_flag)
        if chosen is not None:
            self._validate_precision_choice()
            return chosen
        if self._precision_flag in ("bf16-mixed", "16-mixed"):
            self._validate_precision_choice()
            return HPUPrecision(self._precision_flag)
        return original(self)

    return wrapper


_WRAPPERS = {
    "_choose_auto_accelerator": _choose_auto_accelerator,
    "_set_devices_flag_if_auto_passed": _set_devices_flag_if_auto_passed,
    "_choose_strategy": _choose_strategy,
    "_check_strategy_and_fallback": _check_strategy_and_fallback,
    "_check_and_init_precision": _check_and_init_precision,
}


def connector_class() -> type | None:
    """Lightning's ``_AcceleratorConnector``, or ``None`` when this Lightning has no such class where expected.

    Looked up when called (not at import), so that a Lightning that moved it still imports ``lightning_gaudi``.
    """
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return None
    found = getattr(module, "_AcceleratorConnector", None)
    return found if isinstance(found, type) else None


def installed() -> bool:
    """Whether the accelerator-connector wrappers are in place."""
    connector = connector_class()
    return connector is not None and all(getattr(getattr(connector, name, None), _MARK, False) for name in _WRAPPERS)


def install() -> bool:
    """Wraps the connector methods (idempotent). Returns whether the wrappers are installed.

    On a Lightning version outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or one whose
    connector lacks a method the wrappers rely on, nothing is patched and a warning says what still works (explicit
    strategies and precision plugins).
    """
    if installed():
        return True
    supported = registry.LIGHTNING_SUPPORTED
    connector = connector_class()
    if connector is None:
        missing = [f"{_MODULE}._AcceleratorConnector"]
    else:
        missing = [name for name in CONNECTOR_ATTRIBUTES if not hasattr(connector, name)]
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" connector lacks: {missing or 'nothing'}). `strategy='auto'` and precision strings will not pick"
            " HPU classes: pass `strategy='hpu_single'`/'hpu_parallel' and `plugins=[HPUPrecision(...)]`.",
            stacklevel=2,
        )
        return False
    assert connector is not None
    for name, make in _WRAPPERS.items():
        original = connector.__dict__[name]
        target = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = make(target)
        setattr(wrapped.__func__ if isinstance(wrapped, staticmethod) else wrapped, _MARK, True)
        setattr(connector, name, wrapped)
    return True


PATCH = registry.Patch(
    name="connector",
    targets=tuple(f"{_MODULE}._AcceleratorConnector.{name}" for name in WRAPPED),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
