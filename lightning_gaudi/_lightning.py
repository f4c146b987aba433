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


#: The trainer's evaluation loops, each with an ``inference_mode`` flag read when the loop runs.
EVALUATION_LOOPS = ("validate_loop", "test_loop", "predict_loop")


def disable_inference_mode(trainer: Any) -> None:
    """Makes ``trainer``'s evaluation loops use ``torch.no_grad`` instead of ``torch.inference_mode``.

    Raises:
        RuntimeError: Lightning's loops no longer carry the ``inference_mode`` flag this relies on.
    """
    for name in EVALUATION_LOOPS:
        loop = getattr(trainer, name, None)
        if loop is None or not isinstance(getattr(loop, "inference_mode", None), bool):
            raise RuntimeError(
                f"lightning_gaudi expected `trainer.{name}.inference_mode` (Lightning {SUPPORTED_LIGHTNING});"
                " this Lightning lacks it. Pass `Trainer(inference_mode=False)` instead."
            )
        loop.inference_mode = False


# ---------------------------------------------------------------------------------------------------------------------
# Host-sync-free logging (issue 3)
#
# At every batch end Lightning's ``_LoggerConnector.on_batch_end`` calls ``_ResultCollection.metrics``, which turns
# each ``prog_bar=True`` value into a Python number (``convert_tensors_to_scalars``): a host sync per step, which on
# Gaudi flushes the lazy graph and stalls the host whatever the progress bar's refresh rate. For trainers on the HPU
# accelerator only:
#
# - ``_LoggerConnector.metrics`` (read at every batch end and every ``log_every_n_steps``) leaves progress-bar values
#   as device tensors;
# - ``_LoggerConnector.progress_bar_metrics`` (what the progress bar reads when it refreshes) turns them into numbers;
# - ``_CallbackConnector._configure_progress_bar`` makes the Trainer's default bar a ``TQDMProgressBar`` refreshing
#   every :data:`HPU_PROGRESS_BAR_REFRESH_RATE` steps (a bar the user passes, or ``TQDM_MINITERS``, wins).
#
# Loggers still receive numbers when they write (every ``log_every_n_steps``). ``tests/callbacks/
# test_sync_free_logging.py`` fails when Lightning changes what these wrappers rely on.
# ---------------------------------------------------------------------------------------------------------------------

#: The default progress-bar refresh interval (steps) under HPU; Intel advises 20 or more.
HPU_PROGRESS_BAR_REFRESH_RATE = 20

#: (module, attribute) pairs the logging wrappers replace or rely on; checked before installing.
LOGGING_HOOK_TARGETS = (
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "convert_tensors_to_scalars"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector"),
    ("lightning.pytorch.trainer.connectors.callback_connector", "_CallbackConnector"),
)
_LOGGING_MARK = "__lightning_gaudi_logging_hook__"


class _Deferral:
    active = False


def _on_hpu(trainer: Any) -> bool:
    from lightning_gaudi.accelerator import HPUAccelerator

    strategy = getattr(trainer, "strategy", None)
    return isinstance(getattr(strategy, "accelerator", None), HPUAccelerator)


def _deferring_convert(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(data: Any) -> Any:
        if _Deferral.active:
            return data
        return original(data)

    return wrapper


def _deferring_metrics(original: property) -> property:
    fget = original.fget
    assert fget is not None

    @functools.wraps(fget)
    def getter(self: Any) -> Any:
        if not _on_hpu(self.trainer):
            return fget(self)
        _Deferral.active = True
        try:
            return fget(self)
        finally:
            _Deferral.active = False

    return property(getter)


def _converting_progress_bar_metrics(original: property) -> property:
    from torch import Tensor

    fget = original.fget
    assert fget is not None

    @functools.wraps(fget)
    def getter(self: Any) -> Any:
        metrics = fget(self)
        for key, value in metrics.items():
            if isinstance(value, Tensor):
                metrics[key] = value.item() if value.numel() == 1 else value.tolist()
        return metrics

    return property(getter)


def _hpu_progress_bar(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, enable_progress_bar: bool = True) -> None:
        import os

        from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

        callbacks = self.trainer.callbacks
        configured = any(isinstance(c, ProgressBar) for c in callbacks)
        original(self, enable_progress_bar)
        if configured or not enable_progress_bar or "TQDM_MINITERS" in os.environ or not _on_hpu(self.trainer):
            return
        for index, callback in enumerate(callbacks):
            if isinstance(callback, ProgressBar):
                # Rich's bar reads the metrics at every batch; tqdm's only when it refreshes
                callbacks[index] = TQDMProgressBar(refresh_rate=HPU_PROGRESS_BAR_REFRESH_RATE)

    return wrapper


def logging_hooks_installed() -> bool:
    """Whether the host-sync-free logging wrappers are in place."""
    import importlib

    result = importlib.import_module(LOGGING_HOOK_TARGETS[0][0])
    connector = vars(getattr(importlib.import_module(LOGGING_HOOK_TARGETS[2][0]), "_LoggerConnector", object))
    callbacks = getattr(importlib.import_module(LOGGING_HOOK_TARGETS[3][0]), "_CallbackConnector", None)
    targets = (
        getattr(result, "convert_tensors_to_scalars", None),
        getattr(connector.get("metrics"), "fget", None),
        getattr(connector.get("progress_bar_metrics"), "fget", None),
        getattr(callbacks, "_configure_progress_bar", None),
    )
    return all(getattr(target, _LOGGING_MARK, False) for target in targets)


def _missing_logging_targets() -> list[str]:
    import importlib

    missing = []
    for module_name, attribute in LOGGING_HOOK_TARGETS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        if not hasattr(module, attribute):
            missing.append(f"{module_name}.{attribute}")
    if missing:
        return missing
    from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection

    for name in ("metrics", "progress_bar_metrics"):
        if not isinstance(_LoggerConnector.__dict__.get(name), property):
            missing.append(f"_LoggerConnector.{name} (a property)")
    if "_configure_progress_bar" not in _CallbackConnector.__dict__:
        missing.append("_CallbackConnector._configure_progress_bar")
    if "metrics" not in _ResultCollection.__dict__:
        missing.append("_ResultCollection.metrics")
    return missing


def install_logging_hooks() -> bool:
    """Installs the host-sync-free logging wrappers (idempotent). Returns whether they are installed.

    On a Lightning version outside :data:`SUPPORTED_LIGHTNING`, or one that lacks what the wrappers rely on, nothing
    is patched and a warning says what that costs (a host sync per step for each ``prog_bar`` value).
    """
    import importlib

    if logging_hooks_installed():
        return True
    missing = _missing_logging_targets()
    if not _LIGHTNING_SUPPORTED or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {SUPPORTED_LIGHTNING} ({_LIGHTNING_SUPPORTED.message or 'ok'};"
            f" missing: {missing or 'nothing'}). Progress-bar values will be read to the host at every step; log"
            " with `prog_bar=False` on HPU, or pin a supported Lightning, to avoid the per-step host sync.",
            stacklevel=2,
        )
        return False
    result = importlib.import_module(LOGGING_HOOK_TARGETS[0][0])
    connector = importlib.import_module(LOGGING_HOOK_TARGETS[2][0])._LoggerConnector
    callbacks = importlib.import_module(LOGGING_HOOK_TARGETS[3][0])._CallbackConnector

    convert = _deferring_convert(result.convert_tensors_to_scalars)
    metrics = _deferring_metrics(connector.__dict__["metrics"])
    pbar_metrics = _converting_progress_bar_metrics(connector.__dict__["progress_bar_metrics"])
    configure_bar = _hpu_progress_bar(callbacks._configure_progress_bar)
    for hook in (convert, metrics.fget, pbar_metrics.fget, configure_bar):
        setattr(hook, _LOGGING_MARK, True)
    setattr(result, "convert_tensors_to_scalars", convert)  # noqa: B010
    setattr(connector, "metrics", metrics)  # noqa: B010 - replacing a property
    setattr(connector, "progress_bar_metrics", pbar_metrics)  # noqa: B010
    setattr(callbacks, "_configure_progress_bar", configure_bar)  # noqa: B010
    return True
