"""HPU choices in Lightning's accelerator connector (``_AcceleratorConnector``).

Lightning 2.6's accelerator connector refuses ``accelerator="hpu"`` with ``strategy="auto"`` and turns
``precision="bf16-mixed"`` into CUDA autocast for any accelerator but cpu/mps. Three of its methods are wrapped
so that, for the HPU accelerator only:

- ``_choose_auto_accelerator`` picks "hpu" when an HPU (real or emulated) is available;
- ``_choose_strategy`` picks "hpu_single" for one device and "hpu_parallel" for more (or several nodes);
- ``_check_and_init_precision`` checks the precision against the device and makes mixed precision autocast
  on the HPU device type.

Every other accelerator goes through Lightning's code unchanged. The wrappers are installed once, only on the
Lightning versions they were checked against; ``tests/patches/test_connector.py`` fails when Lightning changes
the methods or attributes they rely on.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.patches import registry
from lightning_gaudi.precision import HPUPrecision, check_precision_supported

_MODULE = "lightning.pytorch.trainer.connectors.accelerator_connector"

#: The connector attributes the wrappers read; checked before installing.
CONNECTOR_ATTRIBUTES = (
    "_choose_auto_accelerator",
    "_choose_strategy",
    "_check_and_init_precision",
    "_validate_precision_choice",
)
#: The connector methods replaced by wrappers.
WRAPPED = ("_choose_auto_accelerator", "_choose_strategy", "_check_and_init_precision")
#: Connector instance attributes the wrappers read.
INSTANCE_ATTRIBUTES = (
    "_accelerator_flag",
    "_num_nodes_flag",
    "_parallel_devices",
    "_precision_flag",
    "_precision_plugin_flag",
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


def _check_and_init_precision(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> Any:
        if not isinstance(self.accelerator, HPUAccelerator) or self._precision_plugin_flag is not None:
            return original(self)
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
