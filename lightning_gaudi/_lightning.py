"""The only place that touches Lightning's private internals.

Lightning 2.6's accelerator connector refuses ``accelerator="hpu"`` with ``strategy="auto"`` and turns
``precision="bf16-mixed"`` into CUDA autocast for any accelerator but cpu/mps. Three of its methods are wrapped
so that, for the HPU accelerator only:

- ``_choose_auto_accelerator`` picks "hpu" when an HPU (real or emulated) is available;
- ``_choose_strategy`` picks "hpu_single" for one device and "hpu_parallel" for more (or several nodes);
- ``_check_and_init_precision`` checks the precision against the device and makes mixed precision autocast
  on the HPU device type.

Every other accelerator goes through Lightning's code unchanged. The wrappers are installed once, only on the
Lightning versions they were checked against; ``tests/test_lightning_hooks.py`` fails when Lightning changes
the methods or attributes they rely on.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from lightning_utilities.core.imports import RequirementCache

SUPPORTED_LIGHTNING = "lightning>=2.5,<2.7"
_LIGHTNING_SUPPORTED = RequirementCache(SUPPORTED_LIGHTNING)

#: The connector attributes the wrappers read; checked before installing.
CONNECTOR_ATTRIBUTES = (
    "_choose_auto_accelerator",
    "_choose_strategy",
    "_check_and_init_precision",
    "_validate_precision_choice",
)
_MARK = "__lightning_gaudi_hook__"


def _is_hpu_flag(flag: Any) -> bool:
    from lightning_gaudi.accelerator import HPUAccelerator

    return flag == "hpu" or isinstance(flag, HPUAccelerator)


def _choose_auto_accelerator(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        from lightning_gaudi import hpu

        if hpu.is_available():
            return "hpu"
        return original(*args, **kwargs)  # type: ignore[no-any-return]

    return staticmethod(wrapper)


def _choose_strategy(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if not _is_hpu_flag(self._accelerator_flag):
            return original(self)
        from lightning_gaudi.strategies import HPUParallelStrategy, SingleHPUStrategy

        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return HPUParallelStrategy.strategy_name
        return SingleHPUStrategy(device=self._parallel_devices[0] if self._parallel_devices else None)

    return wrapper


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        from lightning_gaudi.accelerator import HPUAccelerator

        if not isinstance(self.accelerator, HPUAccelerator) or self._precision_plugin_flag is not None:
            return original(self)
        from lightning_gaudi.precision import HPUPrecision, check_precision_supported

        check_precision_supported(self._precision_flag)
        if self._precision_flag in ("bf16-mixed", "16-mixed"):
            self._validate_precision_choice()
            return HPUPrecision(self._precision_flag)
        return original(self)

    return wrapper


_WRAPPERS = {
    "_choose_auto_accelerator": _choose_auto_accelerator,
    "_choose_strategy": _choose_strategy,
    "_check_and_init_precision": _check_and_init_precision,
}


def connector_hooks_installed() -> bool:
    """Whether the accelerator-connector wrappers are in place."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    return all(getattr(getattr(_AcceleratorConnector, name), _MARK, False) for name in _WRAPPERS)


def install_connector_hooks() -> bool:
    """Wraps the connector methods (idempotent). Returns whether the hooks are installed.

    On a Lightning version outside :data:`SUPPORTED_LIGHTNING`, or one whose connector lacks a method the hooks
    rely on, nothing is patched and a warning says what still works (explicit strategies and precision plugins).
    """
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    if connector_hooks_installed():
        return True
    missing = [name for name in CONNECTOR_ATTRIBUTES if not hasattr(_AcceleratorConnector, name)]
    if not _LIGHTNING_SUPPORTED or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {SUPPORTED_LIGHTNING} ({_LIGHTNING_SUPPORTED.message or 'ok'};"
            f" connector lacks: {missing or 'nothing'}). `strategy='auto'` and precision strings will not pick"
            " HPU classes: pass `strategy='hpu_single'`/'hpu_parallel' and `plugins=[HPUPrecision(...)]`.",
            stacklevel=2,
        )
        return False
    for name, make in _WRAPPERS.items():
        original = _AcceleratorConnector.__dict__[name]
        target = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = make(target)
        setattr(wrapped.__func__ if isinstance(wrapped, staticmethod) else wrapped, _MARK, True)
        setattr(_AcceleratorConnector, name, wrapped)
    return True
