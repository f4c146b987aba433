"""Checkpoints that hold only CPU tensors and are never seen half-written, on a local disk or behind a URL.

A local path gets a temporary, ``fsync`` and ``os.replace``; an object store one upload; another fsspec URL a
temporary moved with ``fs.mv``. Each save first removes stale temporaries (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import logging
import os
import posixpath
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import fsspec
import fsspec.utils
import torch
from fsspec import AbstractFileSystem
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

__all__ = [
    "OBJECT_STORE_PROTOCOLS",
    "STALE_TEMPORARY_AGE_S",
    "CheckpointDiskFullError",
    "HPUCheckpointIO",
    "atomic_torch_save",
    "remove_stale_temporaries",
    "temporary_name",
]

log = logging.getLogger(__name__)

#: Protocols of object stores: no rename, but an object appears whole when its upload completes.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci", "oss"})
#: A temporary written from another machine is stale once it has not been written to for this long (seconds).
STALE_TEMPORARY_AGE_S = 3600.0
_LOCAL_PROTOCOLS = ("file", "local")
_MAX_NAME_IN_TEMPORARY = 200  # keeps the temporary's name under the usual 255-byte limit
_TEMPORARY = re.compile(r"^\..+\.(?P<writer>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]{8}\.tmp$")
_in_flight: set[str] = set()  # temporaries this process is writing now (saves may run in threads)
_in_flight_lock = threading.Lock()


class CheckpointDiskFullError(OSError):
    """A checkpoint could not be saved because its file system is full or over quota; nothing partial was left."""


def _filesystem(path: _PATH) -> tuple[AbstractFileSystem | None, str]:
    """``(None, local path)`` for a local path or ``file://`` URL, else ``(fsspec file system, path within it)``."""
    text = os.fspath(path)
    if "://" not in text and "::" not in text:
        return None, text
    try:
        fs, inner = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError) as error:
        raise ValueError(
            f"Cannot reach the checkpoint path {text!r}: {error}. Install the fsspec implementation of"
            f" {fsspec.utils.get_protocol(text)!r} (s3fs for s3://, gcsfs for gs://, adlfs for az://), or pass a"
            " local path."
        ) from error
    if _protocols(fs) & set(_LOCAL_PROTOCOLS):
        return None, inner
    return fs, inner


def atomic_torch_save(obj: Any, path: _PATH) -> None:
    """``torch.save`` ``obj`` to ``path`` (local or an fsspec URL) so that no reader sees a half-written file; a full
    disk raises :class:`CheckpointDiskFullError` after removing the partial file."""
    fs, target = _filesystem(path)
    if fs is None:
        _save_local(obj, target)
    elif _protocols(fs) & OBJECT_STORE_PROTOCOLS:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        fs.pipe_file(target, buffer.getvalue())
    else:
        _save_with_move(obj, fs, target)


def remove_stale_temporaries(dirpath: _PATH) -> list[str]:
    """Removes (and returns) the temporaries in ``dirpath`` whose writer is gone: not this process's current saves,
    of a dead process of this machine, or (another machine's) untouched for :data:`STALE_TEMPORARY_AGE_S` seconds."""
    return _remove_stale(*_filesystem(dirpath))


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves checkpoints with every tensor on the CPU, atomically (:func:`atomic_torch_save`), to paths or URLs."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"HPUCheckpointIO.save_checkpoint got storage_options={storage_options!r}, which it does not use."
                " Pass a custom CheckpointIO plugin to store extra options."
            )
        atomic_torch_save(move_data_to_device(checkpoint, torch.device("cpu")), path)


def _protocols(fs: AbstractFileSystem) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


@functools.cache
def _writer_id() -> str:
    """This machine as seen by process ids: the host name and the pid namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha1(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:8]


def temporary_name(target_name: str, writer: str | None = None, pid: int | None = None) -> str:
    """A temporary's name for ``target_name``: hidden, with this machine's writer id and process id."""
    writer = _writer_id() if writer is None else writer
    pid = os.getpid() if pid is None else pid
    return f".{target_name[:_MAX_NAME_IN_TEMPORARY]}.{writer}-{pid}-{secrets.token_hex(4)}.tmp"


def _remove_stale(fs: AbstractFileSystem | None, directory: str) -> list[str]:
    removed = []
    now = time.time()
    for path, mtime in _temporaries(fs, directory):
        if not _is_stale(posixpath.basename(path), mtime, now):
            continue
        try:
            if fs is None:
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)  # a sharded save's staging folder
            else:
                fs.rm(path, recursive=True)
        except FileNotFoundError:
            continue  # another process removed it first
        except OSError as error:
            log.warning("lightning_gaudi: could not remove the stale temporary checkpoint %s: %s", path, error)
            continue
        log.info("lightning_gaudi: removed %s, left by an interrupted checkpoint save", path)
        removed.append(path)
    return removed


def _temporaries(fs: AbstractFileSystem | None, directory: str) -> list[tuple[str, float]]:
    """``(path, modification time)`` of the entries in ``directory`` named like our temporaries."""
    try:
        paths = [e.path for e in os.scandir(directory or ".")] if fs is None else fs.ls(directory, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for path in paths:
        if not _TEMPORARY.match(posixpath.basename(path)):
            continue
        try:
            found.append((path, os.lstat(path).st_mtime if fs is None else fs.modified(path).timestamp()))
        except FileNotFoundError:
            continue  # removed meanwhile
        except (NotImplementedError, OSError):
            found.append((path, time.time()))  # its age is unknown: treated as being written now
    return found


def _is_stale(name: str, mtime: float, now: float) -> bool:
    match = _TEMPORARY.match(name)
    if match is None:
        return False
    writer, pid = match["writer"], int(match["pid"])
    if writer == _writer_id():
        if pid == os.getpid():
            with _in_flight_lock:
                return name not in _in_flight
        if not _pid_alive(pid):
            return True
    return now - mtime > STALE_TEMPORARY_AGE_S


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _tracked(name: str, write: Callable[[], None]) -> None:
    """Runs ``write`` with the temporary ``name`` marked as being written by this process."""
    with _in_flight_lock:
        _in_flight.add(name)
    try:
        write()
    finally:
        with _in_flight_lock:
            _in_flight.discard(name)


def _save_local(obj: Any, path: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    _remove_stale(None, directory)
    name = temporary_name(os.path.basename(path))
    tmp = os.path.join(directory, name)

    def write() -> None:
        # mode 0o666 less the umask, as open(path, "wb"); tempfile.mkstemp would make it 0o600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    try:
        _tracked(name, write)
    except BaseException as error:
        full = _disk_full_error(error, path, tmp)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if full is not None:
            raise full from error
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _save_with_move(obj: Any, fs: AbstractFileSystem, path: str) -> None:
    directory = posixpath.dirname(path)
    fs.makedirs(directory, exist_ok=True)
    _remove_stale(fs, directory)
    name = temporary_name(posixpath.basename(path))
    tmp = posixpath.join(directory, name)

    def write() -> None:
        try:
            with fs.open(tmp, "wb") as f:
                torch.save(obj, f)
            fs.mv(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                fs.rm_file(tmp)
            raise

    _tracked(name, write)


_TORCH_SHORT_WRITE = ("unexpected pos", "file write failed")


def _disk_full_error(error: BaseException, path: str, tmp: str) -> CheckpointDiskFullError | None:
    """A clear error when ``error`` or its causes say the disk is full (torch's short write, ENOSPC), else ``None``."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            break
        if isinstance(cause, RuntimeError) and any(text in str(cause) for text in _TORCH_SHORT_WRITE):
            break
        cause = cause.__cause__ or cause.__context__
    else:
        return None
    directory = os.path.dirname(path) or "."
    written = os.stat(tmp).st_size if os.path.exists(tmp) else 0
    try:
        free = f"{shutil.disk_usage(directory).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    if isinstance(cause, OSError) and cause.errno == errno.EDQUOT:
        what, code = "is over its disk quota", errno.EDQUOT
    else:
        what, code = "is full", errno.ENOSPC
    return CheckpointDiskFullError(
        code,
        f"Could not save the checkpoint {path!r}: the file system holding {directory!r} {what} ({cause}; {free},"
        f" {written / 2**20:.0f} MiB written, removed; an earlier checkpoint under this name is untouched). Free some"
        " space (old checkpoints, save_top_k) or save to another file system.",
    )
