"""Resume policy: which checkpoint a (re)started run continues from (:func:`resolve_ckpt_path`: ``"auto"``,
``"last"``, a path or ``None``), checkpoints verified without loading them, and the fallback from one that fails to
load (:func:`load_or_fall_back`). docs/recipes.md ("Resume policy") says what each policy picks and what verifies."""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import pickle
import posixpath
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from fsspec import AbstractFileSystem
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Checkpoint
from torch.distributed.checkpoint import CheckpointException

from lightning_gaudi.checkpoint_io import _filesystem
from lightning_gaudi.distributed import CollectiveError

__all__ = [
    "CHECKPOINT_SUFFIX",
    "CHECKSUMS_FILENAME",
    "POLICIES",
    "REQUEUE_PREFIX",
    "CheckpointDamagedError",
    "CheckpointInfo",
    "UntrustedCheckpointError",
    "is_complete_checkpoint",
    "latest",
    "load_or_fall_back",
    "read_checkpoint_info",
    "resolve_ckpt_path",
    "resolve_in_checkpoint_dir",
    "verify_checkpoint",
]

_PATH: TypeAlias = "str | os.PathLike[str]"

log = logging.getLogger(__name__)

#: The file suffix ``ModelCheckpoint`` gives checkpoints.
CHECKPOINT_SUFFIX = ".ckpt"
#: The named policies :func:`resolve_ckpt_path` accepts besides a path and ``None``.
POLICIES = ("auto", "last")
_LAST_NAME = "last"
#: What Lightning's SLURM auto-requeue (SIGUSR1) names the checkpoints it writes into ``default_root_dir``.
REQUEUE_PREFIX = "hpc_ckpt_"
_TRY_INSTEAD = " Resume from an earlier checkpoint, or use ckpt_path='auto' to pick the newest one that verifies."


class CheckpointDamagedError(ValueError):
    """A checkpoint that is incomplete or damaged; ``reason`` says what is wrong with it."""

    def __init__(self, path: str, reason: str, hint: str = "") -> None:
        super().__init__(f"The checkpoint {path!r} is {reason}.{hint}")
        self.path = path
        self.reason = reason


#: How each call that loads a checkpoint is told to trust one (:class:`UntrustedCheckpointError`), by its name.
TRUSTING_CALLS = {
    **{fn: f"trainer.{fn}(..., ckpt_path=..., weights_only=False)" for fn in ("fit", "validate", "test", "predict")},
    "load": "fabric.load(path, state, weights_only=False)",
}


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holding objects torch's weights-only rules refuse (``holds`` names them); ``call`` (a key of
    :data:`TRUSTING_CALLS`) is the call whose ``weights_only=False`` trusts it."""

    def __init__(self, path: str, holds: str, call: str | None = None) -> None:
        trust = TRUSTING_CALLS.get(call or "", "the call that loads it")
        super().__init__(
            f"The checkpoint {path!r} holds {holds}, which loading under torch's weights-only rules refuses: unpickling"
            f" it could run code from the file, so nothing of it was loaded. If you made this checkpoint yourself and"
            f" trust it, pass weights_only=False: {trust}."
        )
        self.path = path
        self.holds = holds
        self.call = call

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.holds, self.call)

    def for_call(self, call: str) -> UntrustedCheckpointError:
        """The same refusal, naming ``call``."""
        return UntrustedCheckpointError(self.path, self.holds, call)


@dataclass(frozen=True)
class CheckpointInfo:
    """What the resume policy reads from a checkpoint without loading its tensors (``None``: not recorded;
    ``mtime_ns`` -1: unknown; ``crc_checked``: the tensor data was checked against recorded CRC-32s)."""

    path: str
    global_step: int | None
    epoch: int | None
    mtime_ns: int
    crc_checked: bool = False


def read_checkpoint_info(path: _PATH) -> CheckpointInfo:
    """The step and epoch recorded in a checkpoint; :class:`CheckpointDamagedError` when it is missing or damaged."""
    return _inspect(os.fspath(path), verify_data=False)


def verify_checkpoint(path: _PATH) -> CheckpointInfo:
    """:func:`read_checkpoint_info`, after checking every byte of the checkpoint."""
    return _inspect(os.fspath(path), verify_data=True)


def is_complete_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` (following links) verifies (:func:`verify_checkpoint`)."""
    try:
        verify_checkpoint(path)
    except (CheckpointDamagedError, OSError):
        return False
    return True


def latest(dirpath: _PATH | None, requeue_dir: _PATH | None = None) -> str | None:
    """The newest checkpoint (``*.ckpt``) in ``dirpath``, or ``hpc_ckpt_<N>.ckpt`` in ``requeue_dir``, that verifies,
    or ``None`` (also when the folders do not exist yet); one warning names the checkpoints skipped."""
    paths = [] if dirpath is None else _checkpoint_paths(os.fspath(dirpath))
    if requeue_dir is not None:
        paths += [p for p in _checkpoint_paths(os.fspath(requeue_dir), REQUEUE_PREFIX) if p not in paths]
    infos, skipped = [], []
    for path in paths:
        try:
            infos.append(read_checkpoint_info(path))
        except CheckpointDamagedError as error:
            skipped.append(error)
    chosen = None
    for info in sorted(infos, key=_newest_first, reverse=True):
        try:
            chosen = verify_checkpoint(info.path)
            break
        except CheckpointDamagedError as error:
            skipped.append(error)
    if skipped:
        log.warning(
            "lightning_gaudi: %s; skipped %d checkpoint(s) that failed verification: %s",
            f"resuming from {chosen.path}" if chosen else "no checkpoint verifies, starting fresh",
            len(skipped),
            "; ".join(f"{error.path} ({error.reason})" for error in skipped),
        )
    return chosen.path if chosen else None


def resolve_ckpt_path(
    ckpt_path: _PATH | None, dirpath: _PATH | None = None, requeue_dir: _PATH | None = None
) -> str | None:
    """The checkpoint to resume from under ``ckpt_path`` (``"auto"``, ``"last"``, a path or ``None``) in ``dirpath``
    (and, for ``"auto"``, SLURM requeue checkpoints in ``requeue_dir``).

    Raises:
        ValueError: a policy without ``dirpath``, a damaged checkpoint (:class:`CheckpointDamagedError`), or, on SLURM,
            ``"auto"`` finding nothing to resume while a damaged requeue checkpoint is there (Lightning would load it).
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
            chosen = latest(dirpath, requeue_dir)
            if chosen is None and requeue_dir is not None and SLURMEnvironment.detect():
                _refuse_damaged_requeue(os.fspath(requeue_dir))
            return _chosen_by("auto", chosen, dirpath, requeue_dir)
        text = _last(os.fspath(dirpath))
        policy = "last"
    else:
        policy = None
    fs, path = _filesystem(text)
    if not (os.path.exists(path) if fs is None else fs.exists(path)):
        raise FileNotFoundError(
            f"The checkpoint {text!r} does not exist. Pass an existing file, 'auto' (newest checkpoint in the"
            " directory that verifies, or a fresh start) or 'last'."
        )
    try:
        verify_checkpoint(text)
    except CheckpointDamagedError as error:
        raise CheckpointDamagedError(text, error.reason, _TRY_INSTEAD) from None
    return text if policy is None else _chosen_by(policy, text, dirpath, requeue_dir)


def resolve_in_checkpoint_dir(
    ckpt_path: _PATH | None, checkpoint: Checkpoint | None, requeue_dir: _PATH | None = None
) -> str | None:
    """:func:`resolve_ckpt_path` in ``checkpoint``'s folder (``"auto"``: only ``requeue_dir`` while it has none)."""
    dirpath = getattr(checkpoint, "dirpath", None)
    if dirpath is None and ckpt_path is not None and os.fspath(ckpt_path) == "auto":
        return None if requeue_dir is None else _chosen_by("auto", latest(None, requeue_dir), None, requeue_dir)
    return resolve_ckpt_path(ckpt_path, dirpath, requeue_dir)


@dataclass(frozen=True)
class _Choice:
    policy: str
    dirpath: str | None
    requeue_dir: str | None


#: The checkpoints the policies chose in this process, by path: what :func:`load_or_fall_back` may fall back from.
_chosen: dict[str, _Choice] = {}
#: What a checkpoint that failed to load is renamed to (``<name>.unloadable``, then ``-2``...): not a ``*.ckpt``.
UNLOADABLE_SUFFIX = ".unloadable"
_WHY_LENGTH = 300  # of an error quoted in the warning's one line


def _chosen_by(policy: str, path: str | None, dirpath: _PATH | None, requeue_dir: _PATH | None) -> str | None:
    if path is not None:
        folders = (None if d is None else os.fspath(d) for d in (dirpath, requeue_dir))
        _chosen[path] = _Choice(policy, *folders)
    return path


def load_or_fall_back(
    strategy: Any, checkpoint_path: _PATH, load: Callable[[str], dict[str, Any]], call: str = "fit"
) -> dict[str, Any]:
    """``load(checkpoint_path)`` on every rank; when it fails on any rank and a resume policy chose the checkpoint,
    rank 0 renames it to ``<name>.unloadable`` (never deleted), one warning says so, and every rank loads the next
    checkpoint the policy picks instead. A checkpoint given by path is not moved: its error is logged and raised.
    ``call`` (a key of :data:`TRUSTING_CALLS`) names the call that loads it; a
    :class:`~lightning_gaudi.distributed.CollectiveError` is no fault of the checkpoint and propagates.

    Raises:
        CheckpointDamagedError: the policy's checkpoints all failed to load (each moved aside: a restart starts
            fresh under ``"auto"``).
    """
    path = os.fspath(checkpoint_path)
    moved: list[str] = []
    while True:
        error: BaseException | None = None
        try:
            checkpoint = load(path)
        except CollectiveError:
            raise
        except (Exception, CheckpointException) as caught:  # torch's CheckpointException is a BaseException
            error = caught
        failed_anywhere = strategy.reduce_boolean_decision(error is not None, all=False)
        if not failed_anywhere:
            return checkpoint
        choice = _chosen.get(path)
        if isinstance(error, UntrustedCheckpointError):
            error = error.for_call(call)
        why = _first_line(error) if error is not None else "it failed to load on another rank"
        hint = _TRY_INSTEAD if call == "fit" and not isinstance(error, UntrustedCheckpointError) else ""
        if choice is None:
            log.error("lightning_gaudi: could not load the checkpoint %s (%s).%s", path, why, hint)
        # not moved aside, it stays where the policy would pick it again: fail, as without a fallback
        aside = None if choice is None else _move_aside(strategy, path)
        if choice is None or aside is None:
            if error is None:
                raise RuntimeError(f"The checkpoint {path!r} failed to load on another rank.")
            named = _damage_named(path, error, hint)
            if named is error:
                raise error
            raise named from error
        moved.append(f"{path} (now {aside})")
        following = _next_choice(choice)
        if strategy.is_global_zero:
            log.warning(
                "lightning_gaudi: could not load the checkpoint %s (%s): moved it aside to %s; %s",
                path,
                why,
                aside,
                f"resuming from {following}" if following else "no other checkpoint verifies",
            )
        if following is None:
            raise CheckpointDamagedError(
                ", ".join(moved),
                f"unloadable (the last: {why})",
                " Each was moved aside, never deleted; a restart with ckpt_path='auto' starts fresh.",
            ) from error
        path = following


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {lines[0] if lines else ''}"
    if isinstance(error, UntrustedCheckpointError):  # one line, and its end says how to trust it
        return line
    return line if len(line) <= _WHY_LENGTH else f"{line[: _WHY_LENGTH - 3]}..."


def _damage_named(path: str, error: BaseException, hint: str) -> BaseException:
    """``error``, or for a checkpoint that does not verify, a :class:`CheckpointDamagedError` saying why (torch's error
    on a damaged pickle advises loading it with ``weights_only=False``, which cannot help)."""
    if isinstance(error, (UntrustedCheckpointError, CheckpointDamagedError)):
        return error
    try:
        verify_checkpoint(path)
    except CheckpointDamagedError as damaged:
        return CheckpointDamagedError(path, damaged.reason, hint)
    except OSError:
        return error
    return error


def _move_aside(strategy: Any, path: str) -> str | None:
    """Renames the checkpoint ``path`` (on rank 0) to a free ``<name>.unloadable[-N]``; every rank gets that name, or
    ``None`` when it could not be renamed (said in an error line)."""
    aside = None
    if strategy.is_global_zero:
        fs, inner = _filesystem(path)
        exists = os.path.lexists if fs is None else fs.exists
        names = (f"{path}{UNLOADABLE_SUFFIX}{f'-{n}' if n > 1 else ''}" for n in itertools.count(1))
        aside = next(name for name in names if not exists(_filesystem(name)[1]))
        try:
            if fs is None:
                os.rename(inner, _filesystem(aside)[1])
            else:
                fs.mv(inner, _filesystem(aside)[1], recursive=True)
        except OSError as error:
            log.error("lightning_gaudi: could not move the unloadable checkpoint %s aside: %s", path, error)
            aside = None
    aside = strategy.broadcast(aside)
    strategy.barrier("resume: checkpoint moved aside")
    _chosen.pop(path, None)
    return None if aside is None else str(aside)


def _next_choice(choice: _Choice) -> str | None:
    """The checkpoint ``choice``'s policy picks now (the one that failed moved aside), or ``None``."""
    if choice.policy == "auto":
        return _chosen_by("auto", latest(choice.dirpath, choice.requeue_dir), choice.dirpath, choice.requeue_dir)
    try:
        return resolve_ckpt_path(choice.policy, choice.dirpath, choice.requeue_dir)
    except (FileNotFoundError, CheckpointDamagedError):
        return None


def _checkpoint_paths(text: str, prefix: str = "") -> list[str]:
    fs, directory = _filesystem(text)
    return [_join(text, name) for name in _checkpoint_names(fs, directory, text) if name.startswith(prefix)]


def _refuse_damaged_requeue(requeue_dir: str) -> None:
    damaged = _checkpoint_paths(requeue_dir, REQUEUE_PREFIX)  # none verified, or latest() would have chosen one
    if damaged:
        raise CheckpointDamagedError(
            ", ".join(damaged),
            "damaged, and Lightning resumes SLURM requeue checkpoints when ckpt_path is None",
            " Remove them to start fresh, or pass the checkpoint to resume from.",
        )


def _join(dirpath: str, name: str) -> str:
    fs, _ = _filesystem(dirpath)
    return os.path.join(dirpath, name) if fs is None else f"{dirpath.rstrip('/')}/{name}"


def _checkpoint_names(fs: AbstractFileSystem | None, directory: str, text: str) -> list[str]:
    """The names of the ``*.ckpt`` files in ``directory`` (none when it does not exist)."""
    if os.path.isfile(directory) if fs is None else fs.isfile(directory):
        raise NotADirectoryError(f"The checkpoint directory {text!r} is a file; pass the directory.")
    try:
        paths = os.listdir(directory) if fs is None else fs.ls(directory, detail=False)
    except FileNotFoundError:
        return []
    names = [posixpath.basename(p.rstrip("/")) for p in paths]
    return sorted(n for n in names if n.endswith(CHECKPOINT_SUFFIX) and not n.startswith("."))


def _newest_first(info: CheckpointInfo) -> tuple[bool, int, int, int, str]:
    step = -1 if info.global_step is None else info.global_step
    epoch = -1 if info.epoch is None else info.epoch
    return info.global_step is not None, step, epoch, info.mtime_ns, info.path


def _last(dirpath: str) -> str:
    fs, directory = _filesystem(dirpath)
    names = _checkpoint_names(fs, directory, dirpath)
    # last.ckpt, its versions (last-v1.ckpt) and the preemption checkpoint (last-preempted.ckpt), as Lightning's "last"
    lasts = [n for n in names if n[: -len(CHECKPOINT_SUFFIX)] == _LAST_NAME or n.startswith(f"{_LAST_NAME}-")]
    if not lasts:
        raise FileNotFoundError(
            f"ckpt_path='last': there is no last.ckpt in {dirpath!r}. Save one with"
            " ModelCheckpoint(save_last=True), or use ckpt_path='auto' to start fresh when nothing is saved yet."
        )
    infos = []
    for name in lasts:
        try:
            infos.append(read_checkpoint_info(_join(dirpath, name)))
        except CheckpointDamagedError as error:
            raise CheckpointDamagedError(error.path, error.reason, _TRY_INSTEAD) from None
    return max(infos, key=_newest_first).path


_INCOMPLETE = "incomplete (not a whole torch.save archive: a copy or save was interrupted)"
_MISSING = "missing (no such file, or a link to one)"
_CHANGED = "does not match the CRC-32 recorded when it was written (its bytes changed afterwards: a copy or the disk)"
#: The checksum index of a sharded checkpoint: JSON, ``{"algorithm": "crc32", "files": {name: {"crc32": "<8 hex
#: digits>", "size": bytes}}}`` for every file torch's writer wrote (the shards and ``.metadata``), computed by each
#: rank before the staged folder is renamed into place (:func:`lightning_gaudi.strategies._staged.save_staged`).
CHECKSUMS_FILENAME = ".checksums"
_CRC_CHUNK = 8 * 2**20


def _inspect(text: str, verify_data: bool) -> CheckpointInfo:
    fs, path = _filesystem(text)
    try:
        mtime_ns = os.stat(path).st_mtime_ns if fs is None else int(fs.modified(path).timestamp() * 1e9)
    except FileNotFoundError:
        raise CheckpointDamagedError(text, _MISSING) from None
    except (NotImplementedError, OSError, ValueError):
        mtime_ns = -1
    if fs is None and os.path.isdir(path):
        return _inspect_folder(text, mtime_ns, verify_data)
    checkpoint, crc_checked = _probe(text, verify_data)
    step, epoch = (_int_or_none(checkpoint.get(key)) for key in ("global_step", "epoch"))
    return CheckpointInfo(text, step, epoch, mtime_ns, crc_checked)


def _inspect_folder(text: str, mtime_ns: int, verify_data: bool) -> CheckpointInfo:
    """A torch distributed checkpoint (``.metadata``, the shards, ``meta.pt``; the files its checksum index lists
    checked) or DeepSpeed's (``latest`` naming a folder holding every rank's ``*_states.pt``)."""
    entries = set(os.listdir(text))
    if ".metadata" in entries:
        checked = _check_files(text, entries, verify_data)
        info = _inspect(os.path.join(text, "meta.pt"), verify_data)
        return CheckpointInfo(text, info.global_step, info.epoch, mtime_ns, info.crc_checked and checked)
    if "latest" not in entries:
        raise CheckpointDamagedError(text, "a directory without the metadata of a sharded or DeepSpeed checkpoint")
    with open(os.path.join(text, "latest")) as f:
        tag = f.read().strip()
    folder = os.path.join(text, tag)
    states = (
        [n for n in sorted(os.listdir(folder)) if n.endswith("_states.pt")] if tag and os.path.isdir(folder) else []
    )
    infos = {n: _inspect(os.path.join(folder, n), verify_data) for n in states}
    model = next((n for n in states if n.endswith("model_states.pt") and infos[n].global_step is not None), None)
    if model is None:
        raise CheckpointDamagedError(text, f"incomplete: {tag or 'latest'!r} holds no DeepSpeed model states")
    world = _int_or_none(_probe(os.path.join(folder, model), verify_data=False)[0].get("dp_world_size"))
    # ZeRO-3 writes every rank's model states (zero_pp_rank_<r>_mp_rank_<m>_model_states.pt), every stage every
    # rank's optimizer states
    for what, suffix in (("model", "model_states.pt"), ("optimizer", "optim_states.pt")):
        files = [n for n in states if n.endswith(suffix) and (what == "optimizer" or n.startswith("zero_pp_rank_"))]
        if files and world is not None and len(files) != world:
            raise CheckpointDamagedError(
                text, f"incomplete: {len(files)} of its {world} ranks' {what} states are there"
            )
    step = infos[model]
    return CheckpointInfo(text, step.global_step, step.epoch, mtime_ns, all(i.crc_checked for i in infos.values()))


def _check_files(text: str, entries: set[str], verify_data: bool) -> bool:
    """Checks the files the checksum index lists (their sizes; their CRC-32s if ``verify_data``); ``False`` without
    an index."""
    if CHECKSUMS_FILENAME not in entries:
        return False
    try:
        with open(os.path.join(text, CHECKSUMS_FILENAME)) as f:
            index = json.load(f)
        if index.get("algorithm") != "crc32":
            raise ValueError(f"unknown checksum algorithm {index.get('algorithm')!r}")
        files = {str(name): (int(entry["crc32"], 16), int(entry["size"])) for name, entry in index["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointDamagedError(
            text, f"damaged: its checksum index ({CHECKSUMS_FILENAME}) cannot be read ({type(error).__name__}: {error})"
        ) from None
    for name, (crc, size) in sorted(files.items()):
        path = os.path.join(text, name)
        actual = os.path.getsize(path) if name in entries else -1
        if actual != size:
            what = "missing" if actual < 0 else f"{actual} bytes long, not the {size} written"
            raise CheckpointDamagedError(text, f"incomplete: the file {name!r} is {what}")
        if verify_data and _crc32(path) != crc:
            raise CheckpointDamagedError(text, f"damaged: the file {name!r} {_CHANGED}")
    return verify_data


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(_CRC_CHUNK)
        view = memoryview(buffer)
        while read := f.readinto(buffer):
            crc = zlib.crc32(view[:read], crc)
    return crc


def _probe(text: str, verify_data: bool) -> tuple[dict[Any, Any], bool]:
    """The plain values of the ``torch.save`` file ``text``'s pickle (no code of it runs), and whether its CRC-32s were
    checked (every member's if ``verify_data``, else the pickle's)."""
    fs, path = _filesystem(text)
    try:
        with open(path, "rb") if fs is None else fs.open(path, "rb") as raw, zipfile.ZipFile(raw) as archive:
            members = archive.infolist()
            pickles = [m for m in members if m.filename.count("/") == 1 and m.filename.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise CheckpointDamagedError(text, _INCOMPLETE)
            # torch.save with compute_crc32=False records 0 for every member; a real CRC-32 of 0 is a 1 in 2**32 chance
            has_crcs = any(m.CRC != 0 for m in members if m.file_size > 0)
            if verify_data and has_crcs and (bad := archive.testzip()) is not None:
                raise CheckpointDamagedError(text, f"damaged: its member {bad!r} {_CHANGED}")
            if not has_crcs:
                if verify_data:
                    log.warning(
                        "lightning_gaudi: %s records no CRC-32s (saved with torch.utils.serialization.config.save."
                        "compute_crc32=False): its structure and pickle are checked, its tensor data cannot be",
                        text,
                    )
                del pickles[0].CRC  # zipfile checks a member's CRC-32 only when it has one
            payload = archive.read(pickles[0])
    except CheckpointDamagedError:
        raise
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise CheckpointDamagedError(text, _INCOMPLETE) from None
    except FileNotFoundError:
        raise CheckpointDamagedError(text, _MISSING) from None
    except IsADirectoryError:
        raise CheckpointDamagedError(text, "a directory, not a checkpoint file") from None
    try:
        obj = _Probe(io.BytesIO(payload)).load()
    except Exception as error:  # a damaged pickle fails in many ways
        raise CheckpointDamagedError(
            text,
            f"damaged: its pickled object ({pickles[0].filename}) cannot be read ({type(error).__name__}: {error})",
        ) from None
    return obj if isinstance(obj, dict) else {}, has_crcs and verify_data


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Opaque:
    """Stands for every object a pickle names: nothing is imported and no code of the checkpoint runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Opaque:
        return _Opaque()

    def __setstate__(self, state: object) -> None:
        self.state = state  # plain values only, as everything the probe builds

    def _ignore(self, *args: object) -> None:
        pass

    __setitem__ = append = extend = _ignore


class _Probe(pickle.Unpickler):
    """Parses a ``torch.save`` pickle completely, keeping plain values (objects and tensors are :class:`_Opaque`)."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> Any:
        return _Opaque()
