"""Checkpoints read under torch's weights-only rules, so that loading one never runs code from it (docs/recipes.md,
"What resume trusts"). torch reads a distributed checkpoint's ``.metadata`` with ``pickle.load`` and DeepSpeed loads
with ``weights_only=False``: :func:`check_weights_only` reads what they would first, :class:`WeightsOnlyReader` instead.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import re
from collections.abc import Iterable, Sequence
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.futures import Future

from lightning_gaudi.checkpoint_io import _filesystem
from lightning_gaudi.resume import CheckpointDamagedError, UntrustedCheckpointError

__all__ = ["MetadataUnpickler", "WeightsOnlyReader", "check_weights_only", "load_dcp_metadata"]

_METADATA = ".metadata"
_META_PT = "meta.pt"  # Lightning's file of everything but the module and optimizer states
_DCP_MODULES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # how a torch.layout pickles (torch.strided)
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},  # checkpoint_id
}  # fmt: skip
#: DeepSpeed's plain data classes in its optimizer states (built from their fields, no code of theirs runs).
_DEEPSPEED_CLASSES = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)
_MAX_NAMED = 3


def check_weights_only(path: str, safe: Sequence[Any] = ()) -> None:
    """Reads what the checkpoint ``path`` (a file, a URL, a torch distributed or DeepSpeed folder) holds besides tensor
    data under torch's weights-only rules (``safe``: classes admitted besides), running none of it.

    Raises:
        UntrustedCheckpointError: it holds an object those rules refuse (unpickling it could run code).
        CheckpointDamagedError: its pickle cannot be read (damage, not an object refused).
    """
    fs, inner = _filesystem(path)
    if fs is None and os.path.isdir(inner):
        entries = set(os.listdir(inner))
        if _METADATA in entries:
            _check_dcp_folder(path)
        elif "latest" in entries:
            _check_deepspeed_folder(path)
        return  # any other folder: the strategy's loader says what is wrong with it
    with open(inner, "rb") if fs is None else fs.open(inner, "rb") as stream:
        _check_file(path, stream, safe)


def load_dcp_metadata(stream: Any, path: str) -> Metadata:
    """The distributed checkpoint metadata in ``stream`` (of the folder ``path``), read safely."""
    try:
        metadata = MetadataUnpickler(stream, path).load()
    except UntrustedCheckpointError:
        raise
    except Exception as error:  # a damaged pickle fails in many ways
        raise CheckpointDamagedError(
            path, f"damaged: its shard index ({_METADATA}) cannot be read ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointDamagedError(path, f"damaged: its shard index ({_METADATA}) holds a {type(metadata).__name__}")
    return metadata


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles distributed checkpoint metadata admitting only the classes it is made of; any other is refused
    (:class:`UntrustedCheckpointError`)."""

    def __init__(self, stream: Any, path: str) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_MODULES.get(module, ()):
            return getattr(importlib.import_module(module), name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise UntrustedCheckpointError(self.path, f"the object {module}.{name} in its shard index ({_METADATA})")


class WeightsOnlyReader(FileSystemReader):
    """torch's ``FileSystemReader`` reading ``.metadata`` with :class:`MetadataUnpickler` and every non-tensor entry
    under weights-only rules."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = _METADATA if rank is None else f"__{rank}{_METADATA}"
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as stream:
            metadata = load_dcp_metadata(stream, os.fspath(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[union-attr]
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        wrapped: Any = _WeightsOnlyBytes(planner, os.fspath(self.path))
        return super().read_data(plan, wrapped)


class _WeightsOnlyBytes:
    """A load planner whose ``load_bytes`` first reads the entry under weights-only rules (then the planner's own)."""

    def __init__(self, planner: Any, path: str) -> None:
        self._planner = planner
        self._path = path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        _check_file(f"{self._path} (entry {read_item.dest_index.fqn!r})", io.BytesIO(value.getvalue()))
        value.seek(0)
        self._planner.load_bytes(read_item, value)


def _check_file(path: str, stream: IO[bytes], safe: Sequence[Any] = ()) -> None:
    with torch.serialization.safe_globals(list(safe)):
        try:
            torch.load(stream, map_location="meta", weights_only=True)
        except pickle.UnpicklingError as error:
            if isinstance(error, UntrustedCheckpointError):
                raise
            stream.seek(0)
            try:
                unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(stream)
            except Exception:  # a damaged pickle fails in many ways
                unsafe = []
            if unsafe:
                raise UntrustedCheckpointError(path, _objects(unsafe)) from None
            raise CheckpointDamagedError(
                path, f"damaged: its pickled object cannot be read ({_weights_only_reason(error)})"
            ) from None


def _check_dcp_folder(path: str) -> None:
    with open(os.path.join(path, _METADATA), "rb") as stream:
        metadata = load_dcp_metadata(stream, path)
    entries = metadata.state_dict_metadata
    for index, info in (metadata.storage_data or {}).items():
        if not isinstance(entries.get(index.fqn), BytesStorageMetadata):
            continue
        name = info.relative_path
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise CheckpointDamagedError(path, f"damaged: its shard index names a shard outside its folder ({name!r})")
        if getattr(info, "transform_descriptors", None):
            raise UntrustedCheckpointError(
                path, f"the entry {index.fqn!r} written through stream transforms, which cannot be read weights-only"
            )
        with open(os.path.join(path, name), "rb") as shard:
            shard.seek(info.offset)
            data = shard.read(info.length)
        _check_file(f"{path} (entry {index.fqn!r})", io.BytesIO(data))
    meta = os.path.join(path, _META_PT)
    if os.path.isfile(meta):
        with open(meta, "rb") as stream:
            _check_file(meta, stream)


def _check_deepspeed_folder(path: str) -> None:
    with open(os.path.join(path, "latest")) as f:
        tag = f.read().strip()
    folder = os.path.join(path, tag)
    if not tag or os.path.basename(tag) != tag or not os.path.isdir(folder):
        return  # DeepSpeed's loader refuses it (the resume policy's verification names it)
    safe = []
    for module, name in _DEEPSPEED_CLASSES:
        with contextlib.suppress(ImportError, AttributeError):
            safe.append(getattr(importlib.import_module(module), name))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pt"):
            file = os.path.join(folder, name)
            with open(file, "rb") as stream:
                _check_file(file, stream, safe)


def _objects(names: Iterable[str]) -> str:
    ordered = sorted(set(names))
    shown = ", ".join(ordered[:_MAX_NAMED]) + (f" and {len(ordered) - _MAX_NAMED} more" if len(ordered) > 3 else "")
    return f"the object{'s' if len(ordered) > 1 else ''} {shown}"


def _weights_only_reason(error: BaseException) -> str:
    """The reason in torch's weights-only error, without its advice to load with ``weights_only=False``."""
    match = re.search(r"WeightsUnpickler error: (.*?)(?:\n|$)", str(error))
    return match.group(1).strip() if match else type(error).__name__
