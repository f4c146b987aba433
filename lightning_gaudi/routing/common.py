"""The routing both connectors share: which HPU class or precision plugin answers a Lightning name or instance on
HPUs (``docs/strategies.md``)."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.precision import check_precision_supported
from lightning_gaudi.strategies.adoption import adopt, described
from lightning_gaudi.strategies.ddp_settings import START_METHODS

_USE_HPU_STRATEGIES = "strategy='hpu_parallel' (DDP over HCCL, one process per card) or 'hpu_single'"


def claimed_counterparts(cls: type) -> tuple[type, ...]:
    """The Lightning strategy classes ``cls`` itself (not a base) declares it stands in for."""
    declared = vars(cls).get("lightning_counterparts", ())
    return tuple(declared) if isinstance(declared, (tuple, list)) else ()


def is_hpu_strategy_class(cls: type) -> bool:
    """Whether ``cls`` is (or derives from) a strategy declaring Lightning counterparts, i.e. knows the HPU."""
    return any(claimed_counterparts(base) for base in cls.__mro__)


def hpu_counterpart(lightning_cls: type, strategy_registry: dict[str, Any]) -> type | None:
    """The class in ``strategy_registry`` that declares ``lightning_cls`` a counterpart, or ``None``."""
    for entry in strategy_registry.values():
        found = entry.get("strategy")
        if isinstance(found, type) and lightning_cls in claimed_counterparts(found):
            return found
    return None


def interactive() -> bool:
    """Whether Python runs interactively (a notebook, ``python -i``), as Lightning tells it."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def is_hpu(accelerator: object) -> bool:
    """Whether a connector's accelerator flag (or accelerator) is the HPU."""
    return accelerator == "hpu" or isinstance(accelerator, HPUAccelerator)


def _is_lightnings(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric")


@dataclass(frozen=True)
class Routing:
    """The :class:`~lightning_gaudi.patches.connector.ConnectorPolicy` of the Trainer or Fabric (``owner``)."""

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
    #: Fabric's: the Trainer's strategy base, whose lightning_gaudi strategies are refused naming their Fabric twin.
    other_base: type | None = None

    def registered_class(self, flag: object) -> type | None:
        found = self.registry[flag]["strategy"] if isinstance(flag, str) and flag in self.registry else None
        return found if isinstance(found, type) else None

    def _is_single_device(self, flag: object) -> bool:
        cls = type(flag) if isinstance(flag, self.strategy_base) else self.registered_class(flag)
        return cls is not None and issubclass(cls, (self.single_hpu, self.lightning_single))

    def check_flags(self, strategy: Any, accelerator: Any, registered: Sequence[str]) -> None:
        """Raises ``ValueError`` naming the HPU strategies for an unknown ``"hpu..."`` name or any with the HPU."""
        if (
            self.other_base
            and isinstance(strategy, self.other_base)
            and type(strategy).__module__.startswith("lightning_gaudi.")
        ):
            cls = type(strategy).__name__
            raise ValueError(
                f"`strategy={cls}(...)`: lightning_gaudi.{cls} is the Trainer's strategy. With Fabric use"
                f" {self.package}.{cls}(...), which takes the same arguments (`precision` where the Trainer's takes"
                f" `precision_plugin`), or its name, {type(strategy).strategy_name!r}."  # type: ignore[attr-defined]
            )
        if not isinstance(strategy, str):
            return
        name = strategy.lower()
        if name == "auto" or name in registered or not (name.startswith("hpu") or is_hpu(accelerator)):
            return
        names = [
            n for n in self.registry.available_strategies() if is_hpu_strategy_class(self.registered_class(n) or object)
        ]
        hint = "".join(f" Did you mean {close!r}?" for close in difflib.get_close_matches(name, names, n=1))
        raise ValueError(
            f"`strategy={strategy!r}` is not a strategy the {self.owner} knows. The HPU strategies are"
            f" {', '.join(repr(n) for n in names)}, or an instance of one of {self.package}'s strategy classes.{hint}"
        )

    def auto_accelerator(self) -> str | None:
        return "hpu" if hpu.is_available() else None

    def devices(self, accelerator: Any, strategy: Any, devices: Any) -> int | None:
        if not is_hpu(accelerator):
            return None
        if self._is_single_device(strategy):
            return 1
        cards = hpu.get_backend().device_count()
        if interactive() and cards > 1:
            # what Lightning does for several GPUs: a notebook cannot start one process per card
            rank_zero_info(
                f"{self.owner} will use only 1 of {cards} HPUs because it runs in an interactive session: several"
                " HPUs need one process per card, started from a script."
            )
            return 1
        return None

    def choose_strategy(self, accelerator: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        if not is_hpu(accelerator):
            return None
        if num_nodes > 1 or len(parallel_devices) > 1:
            return self.parallel_hpu.strategy_name  # type: ignore[attr-defined]
        return self.single_hpu(device=parallel_devices[0] if parallel_devices else None)

    def check_strategy(self, accelerator: Any, flag: Any, parallel_devices: list[Any], num_nodes: int) -> Any:
        """The strategy (name or instance) that runs ``strategy=flag`` on HPUs; ``ValueError`` for one refused."""
        if not is_hpu(accelerator):
            return flag
        if interactive() and (len(parallel_devices) > 1 or num_nodes > 1) and "LOCAL_RANK" not in os.environ:
            raise ValueError(
                f"{self.owner}(devices={len(parallel_devices)}, num_nodes={num_nodes}) asks for several HPUs in an"
                " interactive session, which cannot start a process per card. Run the training as a script (`python"
                " -m lightning_gaudi train.py` for code that does not import lightning_gaudi), or use devices=1 here."
            )
        adopted = isinstance(flag, self.strategy_base)
        strategy = (
            self.adopt_instance(flag, parallel_devices) if adopted else self.from_lightning_name(flag, parallel_devices)
        )
        if self._is_single_device(strategy) and (len(parallel_devices) > 1 or num_nodes > 1):
            given = f"{type(flag).__name__}(...)" if adopted else repr(flag)
            asker = "the Trainer" if self.owner == "Trainer" else self.owner
            raise ValueError(
                f"`strategy={given}` trains on one HPU, but {asker} asks for {len(parallel_devices)} device(s) on"
                f" num_nodes={num_nodes} node(s). Use strategy='hpu_parallel' to train on all of them, or devices=1."
            )
        return strategy

    def adopt_instance(self, strategy: Any, parallel_devices: list[Any]) -> Any:
        """The strategy that runs the object ``strategy`` on HPUs: an instance of a Lightning class with an HPU stand-in
        adopted, others as they are; ``ValueError``/``TypeError`` for one without a stand-in or refused arguments."""
        cls = type(strategy)
        if is_hpu_strategy_class(cls):
            return strategy
        base = next((base for base in cls.__mro__ if _is_lightnings(base)), None)  # the Lightning class it is
        hpu_cls = hpu_counterpart(base, self.registry) if base is not None else None
        if hpu_cls is None:
            if base is None or base.__name__ in ("Strategy", "ParallelStrategy"):
                return strategy  # a user's own strategy on Lightning's abstract bases: it may well know the HPU
            raise ValueError(
                f"`strategy={cls.__name__}(...)` does not run on HPUs: {self.package} has no HPU version of it. Use"
                f" {_USE_HPU_STRATEGIES}, or 'hpu_fsdp' / 'hpu_model_parallel' to shard the model."
            )
        overrides = {}
        if base is self.lightning_single and getattr(vars(strategy).get("_root_device"), "type", None) != "hpu":
            overrides["device"] = parallel_devices[0] if parallel_devices else None  # a GPU script's "cuda:0"
        adopted, arguments = adopt(strategy, hpu_cls, base, **overrides)
        rank_zero_info(
            f"`strategy={cls.__name__}(...)` with accelerator='hpu': training with {cls.__name__} on"
            f" {hpu_cls.__name__}({described(arguments)})."
        )
        return adopted

    def from_lightning_name(self, name: str, parallel_devices: list[Any]) -> Any:
        """The HPU strategy standing in for the Lightning strategy registered as ``name`` (other names as they are);
        ``ValueError`` for one that forks its ranks or has no HPU stand-in."""
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
                " 'spawn' only (a forked child cannot take over its parent's HPU). Use strategy='hpu_parallel' or"
                " 'hpu_parallel_spawn'."
            )
        settings = ", ".join(f"{key}={value!r}" for key, value in init_params.items())
        rank_zero_info(f"`strategy={name!r}` with accelerator='hpu': training with {hpu_cls.__name__}({settings}).")
        return hpu_cls(**init_params)

    def precision(
        self, accelerator: Any, strategy: Any, precision: Any, plugin: Any, validate: Callable[[], None]
    ) -> Any:
        """The precision plugin on HPUs, or ``None`` to leave it to Lightning; ``ValueError`` for one it cannot run."""
        if precision == "fp8" and plugin is None:
            if not isinstance(accelerator, HPUAccelerator):
                raise ValueError(
                    f"`{self.owner}(precision='fp8')` is lightning_gaudi's FP8 training for Gaudi 2 and later, not"
                    f" on {type(accelerator).__name__}. Use `{self.owner}(accelerator='hpu', precision='fp8')`; for"
                    " NVIDIA GPUs Lightning offers precision='transformer-engine'."
                )
            return self.fp8_plugin(strategy)
        if not isinstance(accelerator, HPUAccelerator):
            return None
        if plugin is not None:
            if type(plugin).__name__ == "MixedPrecision" and getattr(plugin, "device", None) == "hpu":
                # Lightning's plugin as code written for a Gaudi spells it: the HPU's autocast, here too
                return self.mixed_precision(plugin.precision, scaler=plugin.scaler)
            self.check_plugin(plugin)
            return None
        check_precision_supported(precision)
        choose = getattr(strategy, "hpu_precision_plugin", None)  # the strategy's own choice first
        chosen = choose(precision) if callable(choose) else None
        if chosen is None and precision in ("bf16-mixed", "16-mixed"):
            chosen = self.mixed_precision(precision)
        if chosen is not None:
            validate()
        return chosen
