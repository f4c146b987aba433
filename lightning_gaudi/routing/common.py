"""The routing both connectors share: which HPU class or precision plugin answers a Lightning name.

With ``accelerator="hpu"`` (chosen, or picked by ``accelerator="auto"`` when an HPU, real or emulated, is available):

- ``strategy="auto"`` is the API's single-HPU strategy for one device and ``"hpu_parallel"`` for more (or several
  nodes); ``devices="auto"`` is one device for a single-device strategy.
- **Lightning counterparts.** An HPU strategy class may declare ``lightning_counterparts: ClassVar[tuple[type[Strategy],
  ...]]``, the Lightning strategy classes it stands in for (``HPUParallelStrategy``: ``(DDPStrategy,)``,
  ``HPUFSDPStrategy``: ``(FSDPStrategy,)``...). Only a class's own declaration counts, not an inherited one, and the
  class must be in the strategy registry. A Lightning registry name whose class is such a counterpart becomes the HPU
  class built with the registry's ``init_params`` (``"ddp_find_unused_parameters_true"``:
  ``HPUParallelStrategy(start_method='popen', find_unused_parameters=True)``; ``"deepspeed_stage_2"``:
  ``HPUDeepSpeedStrategy(stage=2)``), with an info line; a name whose ``start_method`` forks is refused (a forked
  child cannot take over its parent's HPU); ``"single_device"`` gets the selected device. An instance of a counterpart
  class (or of a user's subclass of one) is refused with an error naming the HPU class; a Lightning name or instance
  no HPU class claims is refused, naming ``"hpu_parallel"`` and ``"hpu_single"``. A single-HPU strategy given several
  devices is refused.
- **Precision.** With no precision plugin given, the precision string is checked against the device, then a strategy
  with a method ``hpu_precision_plugin(precision: str) -> Precision | None`` chooses (a result other than ``None`` is
  the plugin: FSDP autocasts on the HPU device type in its own plugin, DeepSpeed needs ``DeepSpeedPrecision``), and
  otherwise mixed precision is the API's ``HPUPrecision``. ``precision="fp8"`` is the API's FP8 plugin, on HPUs only.

Every other accelerator is left to Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.precision import check_precision_supported
from lightning_gaudi.strategies.ddp_settings import START_METHODS

#: The attribute an HPU strategy class declares to stand in for Lightning strategy classes.
COUNTERPARTS_ATTRIBUTE = "lightning_counterparts"
#: The method a strategy may define to choose the precision plugin for a precision string on HPUs.
PRECISION_HOOK = "hpu_precision_plugin"
_USE_HPU_STRATEGIES = "strategy='hpu_parallel' (DDP over HCCL, one process per card) or 'hpu_single'"


def claimed_counterparts(cls: type) -> tuple[type, ...]:
    """The Lightning strategy classes ``cls`` itself declares it stands in for (inherited declarations do not count,
    so a user's subclass of an HPU strategy never takes over Lightning's names)."""
    declared = vars(cls).get(COUNTERPARTS_ATTRIBUTE, ())
    return tuple(declared) if isinstance(declared, (tuple, list)) else ()


def is_hpu_strategy_class(cls: type) -> bool:
    """Whether ``cls`` is (or derives from) a strategy declaring Lightning counterparts, i.e. knows the HPU."""
    return any(claimed_counterparts(base) for base in cls.__mro__)


def hpu_counterpart(lightning_cls: type, strategy_registry: dict[str, Any]) -> type | None:
    """The strategy class registered in ``strategy_registry`` (the Trainer's or Fabric's) that declares
    ``lightning_cls`` exactly among its ``lightning_counterparts``, or ``None``."""
    for entry in strategy_registry.values():
        found = entry.get("strategy")
        if isinstance(found, type) and lightning_cls in claimed_counterparts(found):
            return found
    return None


def strategy_precision(strategy: object, precision: str) -> Any:
    """The precision plugin ``strategy`` chooses for ``precision`` through its ``hpu_precision_plugin`` method, or
    ``None`` (no such method, or it leaves the choice to the connector)."""
    choose = getattr(strategy, PRECISION_HOOK, None)
    return choose(precision) if callable(choose) else None


def is_hpu(accelerator: object) -> bool:
    """Whether a connector's accelerator flag (or accelerator) is the HPU."""
    return accelerator == "hpu" or isinstance(accelerator, HPUAccelerator)


def _is_lightnings(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric")


@dataclass(frozen=True)
class Routing:
    """The routing policy of one connector, the Trainer's or Fabric's (a
    :class:`~lightning_gaudi.patches.connector.ConnectorPolicy`).

    Attributes:
        owner: ``"Trainer"`` or ``"Fabric"``, for messages.
        package: where the API's HPU classes live, for messages.
        registry: the API's strategy registry.
        strategy_base: the API's ``Strategy`` base class.
        lightning_single: the API's ``SingleDeviceStrategy``.
        single_hpu: the API's ``SingleHPUStrategy``.
        parallel_hpu: the API's ``HPUParallelStrategy``.
        mixed_precision: builds the API's ``HPUPrecision`` for a mixed precision string.
        check_plugin: checks a given precision plugin against the device.
        fp8_plugin: builds the API's FP8 plugin for a strategy (or raises).
    """

    owner: str
    package: str
    registry: Any
    strategy_base: type
    lightning_single: type
    single_hpu: type
    parallel_hpu: type
    mixed_precision: Callable[..., Any]
    check_plugin: Callable[[Any], None]
    fp8_plugin: Callable[[Any], Any]

    def registered_class(self, flag: object) -> type | None:
        """The class registered under the name ``flag``, or ``None``."""
        if isinstance(flag, str) and flag in self.registry:
            found = self.registry[flag]["strategy"]
            return found if isinstance(found, type) else None
        return None

    def _is_single_device(self, flag: object) -> bool:
        cls = type(flag) if isinstance(flag, self.strategy_base) else self.registered_class(flag)
        return cls is not None and issubclass(cls, (self.single_hpu, self.lightning_single))

    def auto_accelerator(self) -> str | None:
        """``"hpu"`` when an HPU (real or emulated) is available."""
        return "hpu" if hpu.is_available() else None

    def devices(self, accelerator: Any, strategy: Any, devices: Any) -> int | None:
        """One device for a single-device strategy (Lightning would take every card, then narrow it to one later)."""
        return 1 if is_hpu(accelerator) and self._is_single_device(strategy) else None

    def choose_strategy(self, accelerator: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        """``strategy="auto"`` on HPUs: the single-HPU strategy for one device, ``"hpu_parallel"`` for more."""
        if not is_hpu(accelerator):
            return None
        if num_nodes > 1 or len(parallel_devices) > 1:
            return self.parallel_hpu.strategy_name  # type: ignore[attr-defined]
        return self.single_hpu(device=parallel_devices[0] if parallel_devices else None)

    def check_strategy(self, accelerator: Any, flag: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        """The strategy (name or instance) that runs ``strategy=flag`` on HPUs (see the module's docstring).

        Raises:
            ValueError: ``flag`` forks its rank processes, is a Lightning strategy without an HPU stand-in, or an
                instance of one with an HPU stand-in (or of a subclass); or it runs on one HPU given several devices.
        """
        if not is_hpu(accelerator):
            return flag
        strategy = flag
        if isinstance(flag, self.strategy_base):
            self.check_lightning_instance(flag)
        else:
            strategy = self.from_lightning_name(flag, parallel_devices)
        if self._is_single_device(strategy) and (len(parallel_devices) > 1 or num_nodes > 1):
            given = f"{type(flag).__name__}(...)" if isinstance(flag, self.strategy_base) else repr(flag)
            asker = "the Trainer" if self.owner == "Trainer" else self.owner
            raise ValueError(
                f"`strategy={given}` trains on one HPU, but {asker} asks for {len(parallel_devices)} device(s) on"
                f" num_nodes={num_nodes} node(s). Use strategy='hpu_parallel' to train on all of them, or devices=1."
            )
        return strategy

    def check_lightning_instance(self, strategy: object) -> None:
        """Refuses an instance of a Lightning strategy (or of a user's subclass of one) that has an HPU stand-in, and
        any other Lightning strategy instance, naming the HPU strategy to use. HPU strategies, and a user's own
        strategies deriving from no Lightning class with an HPU stand-in, pass.

        Raises:
            ValueError: see above.
        """
        cls = type(strategy)
        if is_hpu_strategy_class(cls):
            return
        if _is_lightnings(cls):
            hpu_cls = hpu_counterpart(cls, self.registry)
            if hpu_cls is None:
                fix = f"use {_USE_HPU_STRATEGIES}"
            else:
                fix = f"pass {self.package}'s `{hpu_cls.__name__}(...)` instead, which takes the same arguments"
        else:
            found = next(
                (
                    (base, hpu_cls)
                    for base in cls.__mro__[1:]
                    if _is_lightnings(base) and (hpu_cls := hpu_counterpart(base, self.registry)) is not None
                ),
                None,
            )
            if found is None:
                return  # a user's own strategy: it may well know the HPU
            fix = f"subclass {self.package}'s {found[1].__name__} instead of {found[0].__name__}"
        raise ValueError(
            f"`strategy={cls.__name__}(...)` does not run on HPUs: it sets up neither the HPU, nor HCCL collectives,"
            f" nor HPU checkpointing. With accelerator='hpu', {fix}."
        )

    def from_lightning_name(self, name: str, parallel_devices: list[Any]) -> Any:
        """The HPU strategy that stands in for the Lightning strategy registered as ``name``, built with the
        registry's ``init_params``; other names unchanged.

        Raises:
            ValueError: ``name`` forks its rank processes, or is a Lightning strategy without an HPU stand-in.
        """
        entry = dict.get(self.registry, name)  # the registry's own get() builds a strategy
        cls = entry["strategy"] if entry is not None else None
        if not isinstance(cls, type) or not _is_lightnings(cls):
            return name
        hpu_cls = hpu_counterpart(cls, self.registry)
        if hpu_cls is None:
            raise ValueError(f"`strategy={name!r}` ({cls.__name__}) does not run on HPUs. Use {_USE_HPU_STRATEGIES}.")
        assert entry is not None
        init_params = dict(entry["init_params"])
        if cls is self.lightning_single:
            init_params.setdefault("device", parallel_devices[0] if parallel_devices else None)
            return hpu_cls(**init_params)
        start_method = init_params.get("start_method")
        if start_method is not None and start_method not in START_METHODS:
            raise ValueError(
                f"`strategy={name!r}` forks its rank processes; {hpu_cls.__name__} starts them with 'popen' or"
                " 'spawn' only (a forked child cannot take over its parent's HPU). Use strategy='hpu_parallel' (each"
                " rank re-runs the script) or 'hpu_parallel_spawn'; in a notebook, run the training as a script."
            )
        settings = ", ".join(f"{key}={value!r}" for key, value in init_params.items())
        rank_zero_info(f"`strategy={name!r}` with accelerator='hpu': training with {hpu_cls.__name__}({settings}).")
        return hpu_cls(**init_params)

    def precision(
        self, accelerator: Any, strategy: Any, precision: Any, plugin: Any, validate: Callable[[], None]
    ) -> Any:
        """The precision plugin on HPUs (see the module's docstring), or ``None`` to leave it to Lightning.

        Raises:
            ValueError: the precision does not run on this device, or ``"fp8"`` on another accelerator.
        """
        if precision == "fp8" and plugin is None:
            if not isinstance(accelerator, HPUAccelerator):
                raise ValueError(
                    f"`{self.owner}(precision='fp8')` is lightning_gaudi's FP8 training for Intel Gaudi 2 and later; it"
                    " runs with accelerator='hpu' (a Gaudi, or the emulated HPU with LIGHTNING_GAUDI_EMULATE=eager),"
                    f" not on {type(accelerator).__name__}. Use `{self.owner}(accelerator='hpu', precision='fp8')`;"
                    " for NVIDIA GPUs Lightning offers precision='transformer-engine'."
                )
            return self.fp8_plugin(strategy)
        if not isinstance(accelerator, HPUAccelerator):
            return None
        if plugin is not None:
            self.check_plugin(plugin)
            return None
        check_precision_supported(precision)
        chosen = strategy_precision(strategy, precision)
        if chosen is None and precision in ("bf16-mixed", "16-mixed"):
            chosen = self.mixed_precision(precision)
        if chosen is not None:
            validate()
        return chosen
