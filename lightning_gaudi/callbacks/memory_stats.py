"""Device memory in GiB at every logging step, as optimum-habana reports it."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.patches import logging_cadence

_GIB = 1024**3
#: Logged name -> the ``memory_stats`` key it comes from.
MEMORY_METRICS = {
    "memory_allocated (GB)": "InUse",
    "max_memory_allocated (GB)": "MaxInUse",
    "total_memory_available (GB)": "Limit",
}


def check_interval(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raises a clear error unless ``value`` is a positive int (or 0 where allowed)."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"`{name}={value!r}` must be {kind} number of steps.")


class MemoryStats(Callback):
    """Logs ``memory_allocated (GB)``, ``max_memory_allocated (GB)`` and ``total_memory_available (GB)``.

    The values are the bridge's ``memory_stats()`` ``InUse``, ``MaxInUse`` and ``Limit`` in GiB, rounded to 2 places,
    written to the Trainer's loggers by the rank-zero process only, on the steps Lightning writes the module's own
    logged metrics (every ``log_every_n_steps`` batches that stepped, not while gradients accumulate), so their rows
    line up. Between logging steps nothing is read. Under emulation the same names carry what the host can honestly
    measure: this process's resident memory, its peak, and the machine's physical memory.

    Args:
        log_every_n_steps: the interval in batches that stepped, by Lightning's rule; the Trainer's
            ``log_every_n_steps`` when ``None`` (with ``log_every_n_steps=0`` Lightning logs nothing, and neither
            does this callback).

    Raises:
        ValueError: an interval that is not a positive integer.
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        if log_every_n_steps is not None:
            check_interval("log_every_n_steps", log_every_n_steps)
        self.log_every_n_steps = log_every_n_steps
        self._writes = False
        self._lightning_cadence = True
        self._last_step = -1

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._writes = trainer.is_global_zero and bool(trainer.loggers)  # decided once, not at every batch
        self._lightning_cadence = logging_cadence.installed()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step = trainer.global_step  # after a resume restored it

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._writes:
            return
        if self._lightning_cadence:
            step = logging_cadence.train_log_step(trainer, self.log_every_n_steps)
        else:
            step = self._optimizer_step_to_log(trainer)
        if step is None:
            return
        metrics = read_memory_metrics()
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def _optimizer_step_to_log(self, trainer: pl.Trainer) -> int | None:
        # Lightning's cadence from public state, exact with one optimizer: its logging step is the optimizer step
        # just taken, minus one
        interval = self.log_every_n_steps
        if interval is None:
            interval = int(getattr(trainer, "log_every_n_steps", 50))
        step = trainer.global_step
        if not interval or step == self._last_step:  # no optimizer step in this batch
            return None
        self._last_step = step
        return step - 1 if step % interval == 0 else None


def read_memory_metrics(backend: hpu.Backend | None = None) -> dict[str, float]:
    """The three memory metrics, in GiB rounded to 2 places."""
    stats = (backend or hpu.get_backend()).memory_stats()
    return {name: round(stats[key] / _GIB, 2) for name, key in MEMORY_METRICS.items()}
