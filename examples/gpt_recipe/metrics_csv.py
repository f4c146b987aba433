"""The run's ``metrics.csv`` with one row per step.

Lightning's ``CSVLogger`` writes one row per ``log_metrics`` call, and one logging step brings several: the learning
rate monitor's, the memory statistics', the module's own metrics. Each row then holds one group and leaves the other
columns empty. :class:`StepCSVLogger` gathers what arrives for a step and writes it as one row when the next step
starts, or when the run ends.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import CSVLogger
from typing_extensions import override


class StepCSVLogger(CSVLogger):
    """``CSVLogger`` writing the metrics logged at one step in one row (its arguments are ``CSVLogger``'s)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step: int | None = None
        self._pending: dict[str, Any] = {}

    @override
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self._pending and (step is None or step != self._step):
            self._write()
        if step is None:  # no step to gather under: as Lightning's CSVLogger, a row of its own
            super().log_metrics(metrics, step)
            return
        self._step = step
        self._pending.update(metrics)

    @override
    def finalize(self, status: str) -> None:
        self._write()
        super().finalize(status)

    def _write(self) -> None:
        if self._pending:
            super().log_metrics(self._pending, self._step)
            self._pending = {}
