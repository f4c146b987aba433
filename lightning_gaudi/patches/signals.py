"""SIGTERM during fit, handled by :class:`~lightning_gaudi.callbacks.PreemptionCheckpoint`: Lightning's handler
broadcasts inside the signal handler and its epoch loop adds a collective and a host read per step;
:func:`take_over_sigterm` replaces both on one trainer's instances."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

from lightning_gaudi.patches import registry
from lightning_gaudi.patches._checked import Checked

_CONNECTOR = ("lightning.pytorch.trainer.connectors.signal_connector", "_SignalConnector")
_NOTIFIER = "_sigterm_notifier_fn"
_EPOCH_LOOP = ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop")
_BROADCAST = "_broadcast_sigterm_tensor"


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    missing = []
    connector = registry.lookup(*_CONNECTOR)
    register = getattr(connector, "register_signal_handlers", None)
    if connector is None or not callable(getattr(connector, _NOTIFIER, None)) or register is None:
        missing.append(f"{'.'.join(_CONNECTOR)}.{_NOTIFIER}")
    elif f"self.{_NOTIFIER}" not in inspect.getsource(register):
        missing.append(f"{'.'.join(_CONNECTOR)}.register_signal_handlers registering self.{_NOTIFIER}")
    loop = registry.lookup(*_EPOCH_LOOP)
    if loop is None:
        missing.append(".".join(_EPOCH_LOOP))
    elif hasattr(loop, _BROADCAST) and f"self.{_BROADCAST}()" not in inspect.getsource(loop.advance):
        missing.append(f"{'.'.join(_EPOCH_LOOP)}.advance calling self.{_BROADCAST}()")
    return missing


_State = Checked(
    missing_targets,
    "PreemptionCheckpoint handles only the signals other than SIGTERM; SIGTERM is left to Lightning, which may not"
    " save a checkpoint of a multi-rank job.",
)
#: Whether :func:`take_over_sigterm` was checked against this Lightning; :func:`install` checks it (idempotent).
installed, install = _State.installed, _State.install


def _skip() -> None:
    pass


def take_over_sigterm(trainer: Any, handler: Callable[[int, Any], None]) -> bool:
    """Makes ``handler(signum, frame)`` what ``trainer`` registers for SIGTERM when its fit starts, and skips the
    per-batch broadcast; returns whether SIGTERM was taken over (not on a Lightning this was not checked against)."""
    if not installed():
        return False
    setattr(trainer._signal_connector, _NOTIFIER, handler)
    epoch_loop = trainer.fit_loop.epoch_loop
    if hasattr(epoch_loop, _BROADCAST):
        setattr(epoch_loop, _BROADCAST, _skip)
    return True


def exit_on_repeat(trainer: Any, signals: Iterable[int], code: int) -> None:
    """After a preemption: makes the handler Lightning restores for ``signals`` when ``trainer``'s fit ends one that
    exits at once with ``code``, so a repeated signal during the exit still gives the preemption's exit code."""

    def end(signum: int, frame: Any) -> None:
        os._exit(code)

    handlers = trainer._signal_connector._original_handlers
    for sig in signals:
        handlers[sig] = end


def release_sigterm(trainer: Any) -> None:
    """Undoes :func:`take_over_sigterm` on ``trainer`` (a later fit without the callback gets Lightning's handling)."""
    connector = trainer._signal_connector
    if _NOTIFIER in vars(connector):
        delattr(connector, _NOTIFIER)
    epoch_loop = trainer.fit_loop.epoch_loop
    if vars(epoch_loop).get(_BROADCAST) is _skip:
        delattr(epoch_loop, _BROADCAST)


PATCH = _State.patch(
    "signals",
    (
        f"{'.'.join(_CONNECTOR)}.{_NOTIFIER}",
        f"{'.'.join(_CONNECTOR)}.register_signal_handlers",
        f"{'.'.join(_EPOCH_LOOP)}.{_BROADCAST}",
    ),
)
