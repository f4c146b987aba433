"""``precision="fp8"`` accepted by name in Lightning's Trainer and Fabric, for the HPU accelerator.

Lightning checks precision names in ``lightning.fabric.connector._convert_precision_to_unified_args``, which Fabric's
connector calls and the Trainer's accelerator connector imports by name
(``lightning.pytorch.trainer.connectors.accelerator_connector``); it refuses any name outside its ``Literal``.
:func:`install` replaces the name in both modules with a function that passes ``"fp8"`` through and leaves every other
value to Lightning. The accelerator is known only later: the connectors' ``_check_and_init_precision`` (wrapped in
:mod:`.connector` and :mod:`.fabric_connector`) hands ``"fp8"`` to :func:`trainer_plugin` / :func:`fabric_plugin`,
which build the HPU FP8 plugin, or refuse another accelerator with an error that names the fix.

Installed after (and only with) the connector patches, which route ``"fp8"``; ``tests/patches/
test_fp8_precision_name.py`` fails when Lightning stops checking names there or starts accepting ``"fp8"`` itself.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.patches import connector, fabric_connector, registry

#: The modules that look up the name when a Trainer or Fabric is built.
MODULES = ("lightning.fabric.connector", "lightning.pytorch.trainer.connectors.accelerator_connector")
_NAME = "_convert_precision_to_unified_args"
FP8 = "fp8"
_MARK = "__lightning_gaudi_fp8_hook__"


def _module(name: str) -> ModuleType | None:
    try:  # looked up when called: a Lightning that moved it must still import lightning_gaudi
        return importlib.import_module(name)
    except ImportError:
        return None


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    missing = []
    for name in MODULES:
        module = _module(name)
        if module is None or not callable(getattr(module, _NAME, None)):
            missing.append(f"{name}.{_NAME}")
    if not (connector.installed() and fabric_connector.installed()):
        missing.append("lightning_gaudi's connector patches (they route 'fp8' to the HPU FP8 plugin)")
    return missing


def _wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def convert_precision(precision: Any) -> Any:
        if isinstance(precision, str) and precision == FP8:
            return FP8
        return original(precision)

    setattr(convert_precision, _MARK, True)
    return convert_precision


def _refuse(accelerator: Any, owner: str) -> None:
    given = type(accelerator).__name__
    raise ValueError(
        f"`{owner}(precision='fp8')` is lightning_gaudi's FP8 training for Intel Gaudi 2 and later; it runs with"
        f" accelerator='hpu' (a Gaudi, or the emulated HPU with LIGHTNING_GAUDI_EMULATE=eager), not on {given}."
        f" Use `{owner}(accelerator='hpu', precision='fp8')`; for NVIDIA GPUs Lightning offers"
        " precision='transformer-engine'."
    )


def trainer_plugin(accelerator: Any, strategy: Any = None) -> Any:
    """The Trainer's plugin for ``precision="fp8"`` on ``accelerator`` under ``strategy``.

    Raises:
        ValueError: ``accelerator`` is not the HPU, the HPU cannot train in FP8 (first-generation Gaudi), or the
            strategy shards the model (FSDP, DeepSpeed), with which FP8 is not supported.
    """
    if not isinstance(accelerator, HPUAccelerator):
        _refuse(accelerator, "Trainer")
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)):
        raise ValueError(
            f"`precision='fp8'` is not supported with {type(strategy).__name__}: the FP8 layers and their scaling"
            " state are not sharded. Train FP8 with strategy='hpu_parallel' (or 'hpu_single'), or keep the sharded"
            " strategy with precision='bf16-mixed'."
        )
    from lightning_gaudi.fp8 import HPUFP8Precision  # here: lightning_gaudi.fp8 imports lightning_gaudi.precision

    return HPUFP8Precision()


def fabric_plugin(accelerator: Any) -> Any:
    """Fabric's plugin for ``precision="fp8"`` on ``accelerator``.

    Raises:
        ValueError: ``accelerator`` is not the HPU, or the HPU cannot train in FP8 (first-generation Gaudi).
    """
    if not isinstance(accelerator, HPUAccelerator):
        _refuse(accelerator, "Fabric")
    from lightning_gaudi.fabric.fp8 import HPUFP8Precision

    return HPUFP8Precision()


def installed() -> bool:
    """Whether ``precision="fp8"`` passes Lightning's name check."""
    return all(getattr(getattr(_module(name), _NAME, None), _MARK, False) for name in MODULES)


def install() -> bool:
    """Lets ``"fp8"`` through Lightning's precision-name check (idempotent). Returns whether it does.

    On a Lightning version outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or whose connectors
    changed, nothing is patched and a warning says what still works (the plugin instance).
    """
    if installed():
        return True
    supported = registry.LIGHTNING_SUPPORTED
    missing = missing_targets()
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" missing: {missing or 'nothing'}). `precision='fp8'` is not accepted by name: pass"
            " `plugins=[lightning_gaudi.fp8.HPUFP8Precision()]` (Fabric: lightning_gaudi.fabric.HPUFP8Precision).",
            stacklevel=2,
        )
        return False
    for name in MODULES:
        module = _module(name)
        assert module is not None
        current = getattr(module, _NAME)
        if not getattr(current, _MARK, False):
            setattr(module, _NAME, _wrap(current))
    return True


PATCH = registry.Patch(
    name="fp8_precision_name",
    targets=tuple(f"{name}.{_NAME}" for name in MODULES),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
