"""Device memory through Lightning's ``DeviceStatsMonitor``, at the steps Lightning writes the module's metrics."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override


def check_interval(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raises a clear error unless ``value`` is a positive int (or 0 where allowed)."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"`{name}={value!r}` must be {kind} number of steps.")


class MemoryStats(DeviceStatsMonitor):
    """Lightning's ``DeviceStatsMonitor`` over :meth:`~lightning_gaudi.HPUAccelerator.get_device_stats` (the bridge's
    ``memory_stats``; in emulation this process's and the machine's memory), logged at the end of the training batches
    on which Lightning writes metrics (``MaxInUse`` holds the peak since). ``cpu_stats``: also the host's CPU's."""

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            rank_zero_warn("MemoryStats logs nothing: the Trainer has no logger.")
            return
        super().setup(trainer, pl_module, stage)

    def _skip(self, *args: Any, **kwargs: Any) -> None:
        """Reads nothing: the statistics are read at the end of training batches only."""

    on_train_batch_start = on_validation_batch_start = on_validation_batch_end = _skip
    on_test_batch_start = on_test_batch_end = _skip
