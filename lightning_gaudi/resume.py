"""Resume policy: which checkpoint a (re)started run continues from.

A job restarted by its launcher (``torchrun --max-restarts``, a SLURM requeue) runs the same command again, so the
command itself has to find where training stopped. :func:`resolve_ckpt_path` turns a policy into the path to pass
to ``Trainer.fit(ckpt_path=...)``:

- ``"auto"``: the newest complete checkpoint in the directory, or ``None`` (start fresh) when there is none. This is
  the policy for jobs that may be restarted: the first attempt starts fresh, every later one resumes.
- ``"last"``: the ``last.ckpt`` that ``ModelCheckpoint(save_last=True)`` keeps (a copy or a link); it must exist and
  be complete.
- a path: that checkpoint; it must exist and be complete.
- ``None``: start fresh.

"Complete" means the file is a whole ``torch.save`` archive: its zip central directory, written last, is present
and lists the pickled object. Checking it reads only the file's end, never the tensors. With
:class:`~lightning_gaudi.checkpoint_io.HPUCheckpointIO` (atomic saves) every ``*.ckpt`` is complete; the check
guards against files written by other means (a copy interrupted half-way, a checkpoint from an older tool).

Every rank resolves the policy itself, so the checkpoint directory must be on a file system all ranks see (as for
any Lightning resume), and nothing may be writing to it while a job starts (true after a launcher restart: every
worker of the previous attempt is gone).
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import TypeAlias

from lightning.pytorch.callbacks import Checkpoint

__all__ = [
    "CHECKPOINT_SUFFIX",
    "POLICIES",
    "is_complete_checkpoint",
    "latest",
    "resolve_ckpt_path",
    "resolve_in_checkpoint_dir",
]

_PATH: TypeAlias = "str | os.PathLike[str]"

log = logging.getLogger(__name__)

#: The file suffix ``ModelCheckpoint`` gives checkpoints.
CHECKPOINT_SUFFIX = ".ckpt"
#: The named policies :func:`resolve_ckpt_path` accepts besides a path and ``None``.
POLICIES = ("auto", "last")
_LAST_NAME = "last"


def is_complete_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` is a whole ``torch.save`` file (a truncated or half-copied file is not).

    Follows symbolic links: a link whose target is missing or incomplete is not complete.
    """
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def _candidates(dirpath: Path) -> list[Path]:
    return [p for p in dirpath.iterdir() if p.suffix == CHECKPOINT_SUFFIX and not p.name.startswith(".")]


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns  # follows links: a link is as new as what it points at
    except OSError:
        return -1


def latest(dirpath: _PATH) -> str | None:
    """The newest complete checkpoint (``*.ckpt``, newest by modification time) in ``dirpath``, or ``None``.

    ``None`` also when ``dirpath`` does not exist yet (a first run). Incomplete files are skipped with a warning.

    Example::

        trainer.fit(model, ckpt_path=lightning_gaudi.resume.latest("checkpoints/"))
    """
    directory = Path(dirpath)
    if not directory.exists():
        return None
    if not directory.is_dir():
        raise NotADirectoryError(f"The checkpoint directory {str(directory)!r} is a file; pass the directory.")
    for path in sorted(_candidates(directory), key=lambda p: (_mtime_ns(p), p.name), reverse=True):
        if is_complete_checkpoint(path):
            return str(path)
        log.warning("lightning_gaudi: skipping incomplete checkpoint %s", path)
    return None


def _last(directory: Path) -> Path | None:
    lasts = [p for p in _candidates(directory) if p.stem == _LAST_NAME or p.stem.startswith(f"{_LAST_NAME}-v")]
    return max(lasts, key=lambda p: (_mtime_ns(p), p.name)) if lasts else None


def resolve_ckpt_path(ckpt_path: _PATH | None, dirpath: _PATH | None = None) -> str | None:
    """The checkpoint to resume from under a resume policy (see the module docstring).

    Args:
        ckpt_path: ``"auto"``, ``"last"``, a checkpoint path, or ``None`` (start fresh).
        dirpath: the checkpoint directory (``ModelCheckpoint(dirpath=...)``); needed by ``"auto"`` and ``"last"``.

    Returns:
        A path for ``Trainer.fit(ckpt_path=...)``, or ``None`` to start from scratch.

    Raises:
        ValueError: a policy without ``dirpath``, or a checkpoint that is incomplete.
        FileNotFoundError: the named checkpoint (or ``last.ckpt``) does not exist.
    """
    if ckpt_path is None:
        return None
    text = os.fspath(ckpt_path)
    if text in POLICIES:
        if dirpath is None:
            raise ValueError(
                f"The resume policy {text!r} looks for checkpoints in a directory, but no `dirpath` was given."
                " Pass the ModelCheckpoint directory, e.g. resolve_ckpt_path('auto', 'checkpoints/')."
            )
        if text == "auto":
            return latest(dirpath)
        directory = Path(dirpath)
        last = _last(directory) if directory.is_dir() else None
        if last is None:
            raise FileNotFoundError(
                f"ckpt_path='last': there is no last.ckpt in {str(directory)!r}. Save one with"
                " ModelCheckpoint(save_last=True), or use ckpt_path='auto' to start fresh when nothing is saved yet."
            )
        text = str(last)
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(
            f"The checkpoint {text!r} does not exist. Pass an existing file, 'auto' (newest complete checkpoint in"
            " the directory, or a fresh start) or 'last'."
        )
    if not is_complete_checkpoint(path):
        raise ValueError(
            f"The checkpoint {text!r} is incomplete (not a whole torch.save archive: a copy or save was interrupted)."
            " Resume from an earlier checkpoint, or use ckpt_path='auto' to pick the newest complete one."
        )
    return text


def resolve_in_checkpoint_dir(ckpt_path: _PATH | None, checkpoint: Checkpoint | None) -> str | None:
    """:func:`resolve_ckpt_path` in the folder of a ``ModelCheckpoint`` callback (the Hydra app's and the CLI's).

    ``"auto"`` starts fresh when there is no such callback, or when its folder is only decided at fit time (a
    ``ModelCheckpoint`` without ``dirpath``): nothing can have been saved there by an earlier attempt.
    """
    dirpath = getattr(checkpoint, "dirpath", None)
    if dirpath is None and ckpt_path is not None and os.fspath(ckpt_path) == "auto":
        return None
    return resolve_ckpt_path(ckpt_path, dirpath)
