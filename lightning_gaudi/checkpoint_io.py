"""Checkpoints that hold only CPU tensors and are never seen half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override


def atomic_torch_save(obj: Any, path: _PATH) -> None:
    """``torch.save`` to a temporary file beside ``path``, flushed to disk, then renamed over ``path``.

    A process killed mid-save leaves at most a stray ``.tmp`` file, never a truncated file under ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves checkpoints with every tensor moved to the CPU, atomically (see :func:`atomic_torch_save`).

    A checkpoint saved on an HPU, real or emulated, loads on a CPU-only machine and back.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"HPUCheckpointIO.save_checkpoint got storage_options={storage_options!r}, which it does not use."
                " Pass a custom CheckpointIO plugin to store extra options."
            )
        atomic_torch_save(move_data_to_device(checkpoint, torch.device("cpu")), path)
