"""Sharded checkpoints written as one step for readers: every rank writes into a staging directory beside the target,
which is renamed into place once all have written (``hpu_fsdp``, ``hpu_model_parallel``, ``hpu_deepspeed``, the
Fabric counterparts)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.types import _PATH

from lightning_gaudi.checkpoint_io import remove_stale_temporaries, temporary_name
from lightning_gaudi.distributed import collective_errors

#: Written by rank 0 into a sharded checkpoint beside the shards: everything but the model and optimizer states.
#: Lightning recognises a sharded checkpoint directory by this file.
METADATA_FILENAME = "meta.pt"


def save_staged(strategy: Any, filepath: _PATH, write: Callable[[Path], None]) -> None:
    """Has every rank ``write(staging)`` its shards into a staging folder beside ``filepath`` (``.<name>.<writer>-<pid>-
    <id>.tmp``, removed by a later save if this one is killed), then renames the complete folder to ``filepath`` (a
    collective: call it on every rank).

    A failed write removes the staging directory and leaves a previous checkpoint as it was. Overwriting moves the old
    checkpoint aside first: between those two renames (microseconds) it sits under ``.<name>.old-<id>``.

    Raises:
        ValueError: ``filepath`` is a URL (each rank writes its shard with torch's file-system writer).
    """
    location = os.fspath(filepath)
    if "://" in location and not location.startswith("file://"):
        raise ValueError(
            f"{type(strategy).__name__} writes sharded checkpoints to local paths only (every rank writes its shard"
            f" through torch's file-system writer); got {location!r}. Save to a shared local or mounted path, or save"
            " a full checkpoint (one file, written through the checkpoint IO, which takes URLs)."
        )
    path = Path(strategy.broadcast(location.removeprefix("file://")))
    # named like the checkpoint IO's temporaries (writer and process), so later saves remove it if this one is killed
    staging = path.with_name(strategy.broadcast(temporary_name(path.name)))
    if strategy.is_global_zero:
        remove_stale_temporaries(path.parent)
        staging.mkdir(parents=True)
    strategy.barrier("sharded checkpoint: staging directory")
    try:
        with collective_errors("sharded checkpoint save", strategy.timeout):  # a peer lost mid-save: PeerLostError
            write(staging)  # every rank writes its shard; collective
        strategy.barrier("sharded checkpoint: shards written")
    except BaseException:
        if strategy.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, stays as it was
        raise
    if strategy.is_global_zero:
        _replace(staging, path)
    strategy.barrier("sharded checkpoint: in place")


def save_sharded_checkpoint(
    strategy: Any, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None, model_key: str
) -> None:
    """The Trainer's sharded checkpoint, staged by :func:`save_staged`: the model's (``model_key``) and optimizers'
    (``optimizer_<i>``) states with torch distributed checkpoint, the rest in :data:`METADATA_FILENAME`."""
    if storage_options is not None:
        raise TypeError(f"{type(strategy).__name__} writes sharded checkpoints itself; it takes no `storage_options`.")
    state = {model_key: checkpoint.pop("state_dict")}
    for index, optimizer_state in enumerate(checkpoint.pop("optimizer_states", [])):
        state[f"optimizer_{index}"] = optimizer_state

    def write(staging: Path) -> None:
        dcp.save(state, checkpoint_id=staging)
        if strategy.is_global_zero:
            strategy.checkpoint_io.save_checkpoint(checkpoint, staging / METADATA_FILENAME)

    save_staged(strategy, filepath, write)


def _replace(staging: Path, path: Path) -> None:
    """Renames the complete ``staging`` directory to ``path``, moving a previous checkpoint there aside first."""
    previous = None
    if path.exists() or path.is_symlink():
        previous = path.with_name(f".{path.name}.old-{uuid.uuid4().hex}")
        path.rename(previous)
    staging.rename(path)
    if previous is not None:
        if previous.is_dir() and not previous.is_symlink():
            shutil.rmtree(previous)
        else:
            previous.unlink()
