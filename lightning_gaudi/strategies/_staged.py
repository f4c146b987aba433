"""Sharded checkpoints written as one step for readers: every rank writes into a staging directory beside the target,
renamed into place once all have written; torch distributed checkpoints carry a checksum index
(:class:`ChecksummedWriter`) that :func:`lightning_gaudi.resume.verify_checkpoint` checks."""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import uuid
import zlib
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.types import _PATH
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from lightning_gaudi.checkpoint_io import remove_stale_temporaries, temporary_name
from lightning_gaudi.distributed import collective_errors
from lightning_gaudi.resume import CHECKSUMS_FILENAME

#: Written by rank 0 into a sharded checkpoint beside the shards: everything but the model and optimizer states.
#: Lightning recognises a sharded checkpoint directory by this file.
METADATA_FILENAME = "meta.pt"
_CHECKSUM_PART = ".checksums-rank"  # each rank's part of the index, merged by rank 0 before the rename


def save_staged(strategy: Any, filepath: _PATH, write: Callable[[Path], None]) -> None:
    """Has every rank ``write(staging)`` its shards into a staging folder beside ``filepath``, then renames it to
    ``filepath`` (a collective); a failed write leaves a previous checkpoint as it was. ``ValueError`` for a URL."""
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
    except BaseException:
        if strategy.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint, if any, stays as it was
        raise
    if strategy.is_global_zero:
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
        writer = ChecksummedWriter(staging)
        dcp.save(state, storage_writer=writer)
        writer.write_checksums(strategy.global_rank)
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


class ChecksummedWriter(FileSystemWriter):
    """torch's file-system writer, recording the CRC-32 and size of every file as it writes it (no second read)."""

    def __init__(self, path: _PATH) -> None:
        super().__init__(path)
        self.fs = _ChecksummedFileSystem()

    def write_checksums(self, rank: int) -> None:
        """Writes this rank's part of the index (merged by :func:`save_staged`)."""
        assert isinstance(self.fs, _ChecksummedFileSystem)
        (Path(self.path) / f"{_CHECKSUM_PART}{rank}").write_text(json.dumps(self.fs.written))


class _ChecksummedFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # torch's writer may write several files at once, one per thread

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = _CRC32Stream(raw)
            yield stream
        with self._lock:
            self.written[Path(path).name] = {"crc32": f"{stream.crc:08x}", "size": stream.size}

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # torch writes .metadata as a temporary and renames it
        with self._lock:
            entry = self.written.pop(Path(path).name, None)
            if entry is not None:
                self.written[Path(new_path).name] = entry


class _CRC32Stream(io.IOBase):
    """A file being written, with the CRC-32 and count of the bytes written so far."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.crc = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written: int = self._raw.write(view)
        self.crc = zlib.crc32(view[:written], self.crc)
        self.size += written
        return written

    def tell(self) -> int:
        return int(self._raw.tell())

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._raw.close()


def _merge_checksums(staging: Path) -> None:
    """Merges the ranks' parts of the checksum index into :data:`CHECKSUMS_FILENAME` (nothing when none was written)."""
    parts = sorted(staging.glob(f"{_CHECKSUM_PART}*"))
    if parts:
        files = {name: entry for part in parts for name, entry in json.loads(part.read_text()).items()}
        (staging / CHECKSUMS_FILENAME).write_text(json.dumps({"algorithm": "crc32", "files": files}, sort_keys=True))
    for part in parts:
        part.unlink()
