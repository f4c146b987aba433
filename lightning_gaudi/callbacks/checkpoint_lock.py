"""One live job per checkpoint folder: a lock file in the folder, held by global rank 0 for the length of a fit."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from lightning_gaudi.callbacks.preemption import PreemptionCheckpoint
from lightning_gaudi.distributed.shutdown import cleanup_on_abort

log = logging.getLogger(__name__)

#: The lock's file name in each checkpoint folder (not ``*.ckpt``: no resume policy takes it for a checkpoint).
LOCK_FILENAME = ".lightning_gaudi.lock"
#: Seconds between two heartbeats (the lock file's modification time); a holder silent for ``STALE_AFTER_S`` is gone.
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


class FolderLockedError(RuntimeError):
    """Another live job holds the checkpoint folder's lock."""


def _holder_gone(holder: dict[str, Any], age: float, stale_after: float) -> str | None:
    """Why the lock's holder is gone, or ``None``: on this host, no process with its pid (or this process's pid: an
    earlier run, or a restarted container); on any host, a heartbeat older than ``stale_after``."""
    if holder.get("host") == socket.gethostname():
        pid = holder.get("pid")
        if pid == os.getpid():
            return f"it has this process's pid {pid}"
        try:
            if isinstance(pid, int) and pid > 0:
                os.kill(pid, 0)
        except ProcessLookupError:
            return f"no process {pid} runs on this host"
        except PermissionError:
            pass  # another user's live process
    if age > stale_after:
        return f"its last heartbeat is {age:.0f} s old (over {stale_after:.0f} s)"
    return None


class CheckpointFolderLock:
    """The lock file ``<folder>/.lightning_gaudi.lock`` (JSON: host, pid, start time), created exclusively and touched
    every ``heartbeat`` seconds while held. A gone holder's lock is taken over with a warning."""

    def __init__(self, folder: str, heartbeat: float = HEARTBEAT_S, stale_after: float = STALE_AFTER_S) -> None:
        self.path, self.heartbeat, self.stale_after = os.path.join(folder, LOCK_FILENAME), heartbeat, stale_after
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record = ""

    def acquire(self) -> None:
        """Takes the lock (the folder is created if missing).

        Raises:
            FolderLockedError: a live job holds it; the message names the folder and the holder.
        """
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
        while not self._create():
            try:
                with open(self.path) as file:
                    text = file.read()
                age = time.time() - os.stat(self.path).st_mtime
            except FileNotFoundError:
                continue  # released meanwhile
            try:
                holder = json.loads(text)
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
                who = f"host {holder['host']!r}, pid {holder['pid']}, started {started}"
            except (ValueError, TypeError, KeyError, OverflowError):
                # a holder that died while writing it, or someone else's file: judged by its age only
                holder, who = {}, f"an unreadable lock file, last written {age:.0f} s ago"
            gone = _holder_gone(holder, age, self.stale_after)
            if gone is None:
                raise FolderLockedError(
                    f"The checkpoint folder {os.path.dirname(self.path)!r} is in use by another live job ({who}). Give"
                    " this run its own folder (ModelCheckpoint's dirpath or default_root_dir), or stop the other job;"
                    f" if it is gone, delete {self.path}."
                )
            aside = f"{self.path}.{uuid.uuid4().hex}"
            with contextlib.suppress(FileNotFoundError):  # another taker renamed it first: try again
                os.rename(self.path, aside)  # atomic: one taker wins
                with open(aside) as file:
                    taken = file.read()
                if taken != text:  # another taker's new lock, created since it was read: put it back
                    with contextlib.suppress(FileExistsError):
                        os.link(aside, self.path)
                else:
                    log.warning(
                        "lightning_gaudi: took over the checkpoint folder lock %s from %s: %s.", self.path, who, gone
                    )
                os.remove(aside)
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="lightning_gaudi-lock-heartbeat", daemon=True)
        self._thread.start()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as file:
            file.write(self._record)
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(OSError):  # a shared filesystem's hiccup: the next beat tries again
                os.utime(self.path)

    def release(self) -> None:
        """Stops the heartbeat and removes the lock file if it is still this holder's."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        with contextlib.suppress(OSError):
            with open(self.path) as file:
                ours = file.read() == self._record
            if ours:
                os.remove(self.path)


class CheckpointLock(Callback):
    """Holds a :class:`CheckpointFolderLock` in every local checkpoint folder while ``fit`` runs (global rank 0 only).
    The HPU strategies add it (docs/recipes.md, "One job per checkpoint folder").

    Args:
        heartbeat: seconds between two refreshes of the lock file while it is held.
        stale_after: seconds without a refresh after which a lock counts as abandoned (well above ``heartbeat`` and
            the clock skew between the hosts sharing the folder).
    """

    def __init__(self, heartbeat: float = HEARTBEAT_S, stale_after: float = STALE_AFTER_S) -> None:
        if not 0 < heartbeat < stale_after:
            raise ValueError(
                f"CheckpointLock needs 0 < heartbeat < stale_after (a few heartbeats), got heartbeat={heartbeat!r},"
                f" stale_after={stale_after!r}."
            )
        self.heartbeat, self.stale_after = heartbeat, stale_after
        self._locks: list[CheckpointFolderLock] = []
        self._on_abort = contextlib.ExitStack()

    @staticmethod
    def folders(trainer: pl.Trainer) -> list[str]:
        """The local folders the fit's checkpoint callbacks write to (their ``dirpath``, set up by then)."""
        writers = (Checkpoint, PreemptionCheckpoint)
        folders = {getattr(c, "dirpath", None) for c in trainer.callbacks if isinstance(c, writers)}  # type: ignore[attr-defined]
        return sorted({os.path.abspath(os.fspath(f)) for f in folders if f is not None and "://" not in os.fspath(f)})

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        refused = None
        if trainer.is_global_zero:
            try:
                for folder in self.folders(trainer):
                    lock = CheckpointFolderLock(folder, self.heartbeat, self.stale_after)
                    lock.acquire()
                    self._locks.append(lock)
                self._on_abort.enter_context(cleanup_on_abort(self._drop_locks))  # a job ended at once releases too
            except FolderLockedError as error:
                self._release()
                refused = str(error)
        refused = trainer.strategy.broadcast(refused)  # every rank stops before training, with the same message
        if refused is not None:
            raise FolderLockedError(refused)

    def _drop_locks(self) -> None:
        while self._locks:
            self._locks.pop().release()

    def _release(self) -> None:
        self._on_abort.close()
        self._drop_locks()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release()


def add_default_lock(trainer: pl.Trainer) -> None:
    """Adds a :class:`CheckpointLock` to ``trainer.callbacks`` unless one is there, after the checkpoint callbacks
    (whose folders are set up by then)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    lock = next((c for c in callbacks if isinstance(c, CheckpointLock)), None) or CheckpointLock()
    if lock in callbacks:
        callbacks.remove(lock)
    callbacks.append(lock)
