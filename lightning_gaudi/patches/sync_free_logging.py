"""Host-sync-free logging on the HPU: Lightning reads each ``prog_bar=True`` value to the host at every batch end; here
``_LoggerConnector.metrics`` leaves them as tensors, ``progress_bar_metrics`` converts them when the bar refreshes,
and the default bar is a ``TQDMProgressBar`` refreshing every :data:`HPU_PROGRESS_BAR_REFRESH_RATE` steps."""

from __future__ import annotations

import functools
import os
from typing import Any

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from torch import Tensor

from lightning_gaudi.patches import registry

#: The default progress-bar refresh interval (steps) under HPU; Intel advises 20 or more.
HPU_PROGRESS_BAR_REFRESH_RATE = 20

_RESULT = "lightning.pytorch.trainer.connectors.logger_connector.result"
_LOGGER_CONNECTOR = "lightning.pytorch.trainer.connectors.logger_connector.logger_connector"
_CALLBACK_CONNECTOR = "lightning.pytorch.trainer.connectors.callback_connector"

#: (module, attribute) pairs the wrappers replace or rely on.
TARGETS = (
    (_RESULT, "convert_tensors_to_scalars"),
    (_RESULT, "_ResultCollection"),
    (_LOGGER_CONNECTOR, "_LoggerConnector"),
    (_CALLBACK_CONNECTOR, "_CallbackConnector"),
)
_MARK = "__lightning_gaudi_logging_hook__"


class _Deferral:
    active = False


def _on_hpu(trainer: Any) -> bool:
    accelerator = getattr(getattr(trainer, "strategy", None), "accelerator", None)
    entry = dict.get(AcceleratorRegistry, "hpu")
    return entry is not None and isinstance(accelerator, entry["accelerator"])


def _deferring_convert(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(data: Any) -> Any:
        return data if _Deferral.active else original(data)

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
        callbacks = self.trainer.callbacks
        configured = any(isinstance(c, ProgressBar) for c in callbacks)
        original(self, enable_progress_bar)
        if configured or not enable_progress_bar or not _on_hpu(self.trainer):
            return
        # Lightning's default is Rich's bar whenever `rich` is installed; it reads the metrics at every batch, tqdm's
        # only when it refreshes. A user's TQDM_MINITERS sets tqdm's refresh (tqdm reads it itself).
        refresh = 1 if "TQDM_MINITERS" in os.environ else HPU_PROGRESS_BAR_REFRESH_RATE
        for index, callback in enumerate(callbacks):
            if isinstance(callback, ProgressBar):
                callbacks[index] = TQDMProgressBar(refresh_rate=refresh)

    return wrapper


def installed() -> bool:
    """Whether the host-sync-free logging wrappers are in place."""
    result = registry.lookup(_RESULT)
    connector = vars(getattr(registry.lookup(_LOGGER_CONNECTOR), "_LoggerConnector", object))
    callbacks = getattr(registry.lookup(_CALLBACK_CONNECTOR), "_CallbackConnector", None)
    targets = (
        getattr(result, "convert_tensors_to_scalars", None),
        getattr(connector.get("metrics"), "fget", None),
        getattr(connector.get("progress_bar_metrics"), "fget", None),
        getattr(callbacks, "_configure_progress_bar", None),
    )
    return all(getattr(target, _MARK, False) for target in targets)


def missing_targets() -> list[str]:
    """What the wrappers rely on and this Lightning lacks (empty when everything is there)."""
    missing = [
        m if registry.lookup(m) is None else f"{m}.{a}" for m, a in TARGETS if not hasattr(registry.lookup(m), a)
    ]
    if missing:
        return missing
    connector = vars(registry.lookup(_LOGGER_CONNECTOR, "_LoggerConnector"))
    missing = [
        f"_LoggerConnector.{name} (a property)"
        for name in ("metrics", "progress_bar_metrics")
        if not isinstance(connector.get(name), property)
    ]
    if "_configure_progress_bar" not in vars(registry.lookup(_CALLBACK_CONNECTOR, "_CallbackConnector")):
        missing.append("_CallbackConnector._configure_progress_bar")
    if "metrics" not in vars(registry.lookup(_RESULT, "_ResultCollection")):
        missing.append("_ResultCollection.metrics")
    return missing


def install() -> bool:
    """Installs the wrappers (idempotent); returns whether they are installed."""
    if installed():
        return True
    fallback = (
        "Progress-bar values will be read to the host at every step; log with `prog_bar=False` on HPU, or pin a"
        " supported Lightning, to avoid the per-step host sync."
    )
    if not registry.supported(missing_targets(), fallback):
        return False
    result = registry.lookup(_RESULT)
    connector = registry.lookup(_LOGGER_CONNECTOR, "_LoggerConnector")
    callbacks = registry.lookup(_CALLBACK_CONNECTOR, "_CallbackConnector")

    convert = _deferring_convert(result.convert_tensors_to_scalars)
    metrics = _deferring_metrics(connector.__dict__["metrics"])
    pbar_metrics = _converting_progress_bar_metrics(connector.__dict__["progress_bar_metrics"])
    configure_bar = _hpu_progress_bar(callbacks._configure_progress_bar)
    for hook in (convert, metrics.fget, pbar_metrics.fget, configure_bar):
        setattr(hook, _MARK, True)
    setattr(result, "convert_tensors_to_scalars", convert)  # noqa: B010
    setattr(connector, "metrics", metrics)  # noqa: B010 - replacing a property
    setattr(connector, "progress_bar_metrics", pbar_metrics)  # noqa: B010
    setattr(callbacks, "_configure_progress_bar", configure_bar)  # noqa: B010
    return True


PATCH = registry.Patch(
    name="sync_free_logging",
    targets=(
        f"{_RESULT}.convert_tensors_to_scalars",
        f"{_LOGGER_CONNECTOR}._LoggerConnector.metrics",
        f"{_LOGGER_CONNECTOR}._LoggerConnector.progress_bar_metrics",
        f"{_CALLBACK_CONNECTOR}._CallbackConnector._configure_progress_bar",
    ),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
