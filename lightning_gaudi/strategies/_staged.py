"""Sharded checkpoints written as one step for readers: every rank writes into a staging directory beside the target,
renamed into place once all have written; torch distributed checkpoints carry a checksum index that
:func:`lightning_gaudi.resume.verify_checkpoint` checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.types import _PATH

from lightning_gaudi.checkpoint_io import remove_stale_temporaries, temporary_name
from lightning_gaudi.distributed import collective_errors
from lightning_gaudi.resume import CHECKSUMS_FILENAME, _crc32

#: Written by rank 0 into a sharded checkpoint beside the shards: everything but the model and optimizer states.
#: Lightning recognises a sharded checkpoint directory by this file.
METADATA_FILENAME = "meta.pt"
_CHECKSUM_PART = ".checksums-rank"  # each rank's part of the index, merged by rank 0 before the rename


def save_staged(strategy: Any, filepath: _PATH, write: Callable[[Path], None], checksums: bool = False) -> None:
    """Has every rank ``write(staging)`` its shards into a staging folder beside ``filepath``, then renames it to
    ``filepath`` (a collective); a failed write leaves a previous checkpoint as it was. ``ValueError`` for a URL.
    ``checksums``: the folder, a torch distributed checkpoint, gets its checksum index."""
    location = os.fspath(filepath)
    if "://" in location and not location.startswith("file://"):
        raise ValueError(
            f"{type(strategy).__name__} writes sharded checkpoints to local paths only, got {location!r}. Save to a"
            " shared local or mounted path, or save a full checkpoint (one file, which may go to a URL)."
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
        if checksums:
            _write_checksums(staging, strategy.global_rank)
            strategy.barrier("sharded checkpoint: checksums written")
    except BaseException:
        if strategy.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, stays as it was
        raise
    if strategy.is_global_zero:
        if checksums:
            _merge_checksums(staging)
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

    save_staged(strategy, filepath, write, checksums=True)


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


def _write_checksums(staging: Path, rank: int) -> None:
    """Writes this rank's part of the checksum index: the CRC-32 and size of the shards torch's writer names for it
    (``__<rank>_<n>.distcp``); rank 0's also of every other file but ``meta.pt`` (which has CRC-32s of its own)."""
    files = {}
    for path in staging.iterdir():
        shard = re.match(r"__(\d+)_", path.name)
        mine = int(shard[1]) == rank if shard else rank == 0 and path.name != METADATA_FILENAME
        if mine and not path.name.startswith(CHECKSUMS_FILENAME):  # nor the ranks' parts of the index
            files[path.name] = {"crc32": f"{_crc32(str(path)):08x}", "size": path.stat().st_size}
    (staging / f"{_CHECKSUM_PART}{rank}").write_text(json.dumps(files))


def _merge_checksums(staging: Path) -> None:
    """Merges the ranks' parts of the checksum index into :data:`CHECKSUMS_FILENAME`."""
    parts = sorted(staging.glob(f"{_CHECKSUM_PART}*"))
    files = {name: entry for part in parts for name, entry in json.loads(part.read_text()).items()}
    (staging / CHECKSUMS_FILENAME).write_text(json.dumps({"algorithm": "crc32", "files": files}, sort_keys=True))
    for part in parts:
        part.unlink()
