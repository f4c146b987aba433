"""When Lightning writes a training batch's logged metrics, and at which step, asked from ``on_train_batch_end``.

Lightning writes them in ``_LoggerConnector.update_train_step_metrics``, right after the ``on_train_batch_end``
hooks: not while gradients accumulate (automatic optimization and ``fit_loop._should_accumulate()``), otherwise
when ``_LoggerConnector.should_update_logs`` holds (``(_batches_that_stepped + 1) % log_every_n_steps == 0``, or
the trainer should stop), at step ``fit_loop.epoch_loop._batches_that_stepped``: batches that stepped, not optimizer
steps as ``trainer.global_step`` counts them. (Under ``fast_dev_run`` Lightning logs every step, to a logger that
writes nothing.) :func:`train_log_step` reads the same state, so :class:`~lightning_gaudi.callbacks.MemoryStats`
writes its rows on the steps Lightning writes the module's own. ``tests/patches/test_logging_cadence.py`` fails
when Lightning changes any of this.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

from lightning_gaudi.patches import registry

_LOGGER_CONNECTOR = "lightning.pytorch.trainer.connectors.logger_connector.logger_connector"
_FIT_LOOP = "lightning.pytorch.loops.fit_loop"
_EPOCH_LOOP = "lightning.pytorch.loops.training_epoch_loop"
_TARGETS = (
    (_LOGGER_CONNECTOR, "_LoggerConnector.update_train_step_metrics"),
    (_LOGGER_CONNECTOR, "_LoggerConnector.should_update_logs"),
    (_LOGGER_CONNECTOR, "_LoggerConnector.log_metrics"),
    (_FIT_LOOP, "_FitLoop._should_accumulate"),
    (_EPOCH_LOOP, "_TrainingEpochLoop.on_advance_end"),
)
#: What :func:`train_log_step` reads, and the Lightning code that decides the same thing.
TARGETS = tuple(f"{module}.{qualified}" for module, qualified in _TARGETS)
#: Names each Lightning function must still use for the rule above to hold: (module, qualified name, names).
USES = (
    (_LOGGER_CONNECTOR, "_LoggerConnector.update_train_step_metrics", ("_should_accumulate", "should_update_logs")),
    (_LOGGER_CONNECTOR, "_LoggerConnector.log_metrics", ("_batches_that_stepped",)),
    (_EPOCH_LOOP, "_TrainingEpochLoop.on_advance_end", ("_batches_that_stepped",)),
)


class _State:
    enabled = False


def _lookup(module: str, qualified: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in qualified.split("."):
        found = inspect.getattr_static(found, part)
    return found.fget if isinstance(found, property) else found


def missing_targets() -> list[str]:
    """What :func:`train_log_step` relies on and this Lightning lacks or changed; empty when all is as checked."""
    missing = []
    for module, qualified in _TARGETS:
        try:  # looked up when called: a Lightning that moved them must still import lightning_gaudi
            _lookup(module, qualified)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{qualified}")
    for module, qualified, names in USES:
        try:
            code = _lookup(module, qualified).__code__
        except (ImportError, AttributeError):
            continue  # reported above
        missing += [f"{module}.{qualified} using {name}" for name in names if name not in code.co_names]
    return missing


def installed() -> bool:
    """Whether :func:`train_log_step` was checked against this Lightning."""
    return _State.enabled


def install() -> bool:
    """Checks Lightning's training-step logging (idempotent). Returns whether :func:`train_log_step` may be used.

    On a Lightning version outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or one that logs
    otherwise, a warning says what still works.
    """
    if _State.enabled:
        return True
    supported = registry.LIGHTNING_SUPPORTED
    missing = missing_targets()
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" missing: {missing or 'nothing'}). MemoryStats will log every n optimizer steps, which lines up with"
            " Lightning's own rows only with one optimizer; everything else works.",
            stacklevel=2,
        )
        return False
    _State.enabled = True
    return True


def train_log_step(trainer: Any, every_n_steps: int | None = None) -> int | None:
    """The step at which Lightning writes this training batch's logged metrics, or ``None`` when it writes none.

    Call it from ``on_train_batch_end``, before Lightning counts the batch as stepped.

    Args:
        trainer: the ``lightning.pytorch.Trainer`` that is fitting.
        every_n_steps: the same rule at this interval instead of the Trainer's ``log_every_n_steps``.

    Raises:
        RuntimeError: this Lightning was not checked (:func:`installed` is false).
    """
    if not installed():
        raise RuntimeError(
            f"lightning_gaudi reads Lightning's logging cadence only on {registry.SUPPORTED_LIGHTNING}"
            f" (missing or changed: {missing_targets() or 'nothing'};"
            f" {registry.LIGHTNING_SUPPORTED.message or 'version ok'})."
        )
    loop = trainer.fit_loop
    if trainer.lightning_module.automatic_optimization and loop._should_accumulate():
        return None
    step: int = loop.epoch_loop._batches_that_stepped
    if every_n_steps is None:
        due = trainer._logger_connector.should_update_logs
    else:
        due = (step + 1) % every_n_steps == 0 or trainer.should_stop
    return step if due else None


PATCH = registry.Patch(
    name="logging_cadence",
    targets=TARGETS,
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
