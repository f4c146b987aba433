"""The compile cache policy (docs/runtime.md, "Compile caches"): torch's compile caches (FX graph, AOTAutograd,
inductor's others) in one folder per :func:`cache_key` under :func:`~lightning_gaudi.hpu.runtime.compile_cache_root`,
shared by a node's ranks and kept across restarts, so a changed torch, Gaudi software, generation, layout or precision
never reads another's entries; and torch's portable cache artifacts saved beside the checkpoints
(:func:`save_artifacts`) and loaded before anything compiles (:func:`load_artifacts`), so a job restarted on another
node starts warm. Intel's recipe cache gets its folder where the bridge loads
(:func:`~lightning_gaudi.hpu.runtime.default_recipe_cache`)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from pathlib import Path
from typing import Any

import torch

from lightning_gaudi import hpu
from lightning_gaudi.hpu import runtime

log = logging.getLogger(__name__)

#: torch's variable for the folder of its compile caches (``torch._inductor.runtime.cache_dir_utils.cache_dir``).
TORCH_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: The portable artifacts' file name beside the checkpoints: ``compile_cache-<key>.bin``.
ARTIFACTS_PREFIX = "compile_cache-"


def cache_key(device_name: str, world_size: int, layout: str, precision: str) -> tuple[str, dict[str, Any]]:
    """A short digest of what makes compiled code reusable, and what it was made of."""
    parts = {
        "torch": torch.__version__,
        "gaudi_software": runtime.bridge_release(),
        "device": device_name,
        "world_size": world_size,
        "layout": layout,
        "precision": precision,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16], parts


def use(key: str, parts: dict[str, Any]) -> Path | None:
    """Points torch's compile caches at ``<root>/<key>`` (``key.json`` there says what it was made of); ``None``, and
    nothing changes, when the policy is off."""
    root = runtime.compile_cache_root()
    if root is None:
        return None
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "key.json"
    if not record.exists():
        _write(record, (json.dumps(parts, indent=1) + "\n").encode())
    os.environ[TORCH_CACHE_ENV] = str(folder)
    return folder


def artifacts_path(dirpath: str | os.PathLike[str], key: str) -> Path:
    """Where the portable artifacts of ``key`` are kept in a checkpoint folder (their kernels: ``.kernels.tar``)."""
    return Path(dirpath) / f"{ARTIFACTS_PREFIX}{key}.bin"


def _kernels(path: Path) -> Path:
    return path.with_suffix(".kernels.tar")


def _safe(member: tarfile.TarInfo) -> bool:
    """A kernel as :func:`save_artifacts` packs one: a plain file, two levels down, with no way out of the folder."""
    parts = Path(member.name).parts
    return member.isfile() and len(parts) == 2 and ".." not in parts and not member.name.startswith("/")


def save_artifacts(path: Path, unless: bytes | None = None) -> bytes | None:
    """Writes torch's portable cache artifacts of this process (``torch.compiler.save_cache_artifacts``, torch 2.7
    and newer) to ``path``, and the kernels inductor built into the policy's folder (shared libraries, which the
    artifacts leave out and a CPU build finds by path) to ``<path>.kernels.tar``, unless the artifacts equal
    ``unless``; returns the artifacts, ``None`` when this torch has none to give or the policy is off."""
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    saved = save() if save is not None and runtime.compile_cache_root() is not None else None
    if saved is None:
        return unless
    if saved[0] == unless:
        return unless
    folder = os.environ.get(TORCH_CACHE_ENV, "")  # torch's folder, where inductor built the kernels
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, saved[0])
        with io.BytesIO() as packed:
            with tarfile.open(fileobj=packed, mode="w") as tar:
                for kernel in sorted(Path(folder).glob("*/*.so")) if folder else []:
                    tar.add(kernel, str(kernel.relative_to(folder)))
            _write(_kernels(path), packed.getvalue())
    except OSError as error:  # never in the way of the checkpoint being saved
        log.warning("lightning_gaudi: could not save the compile cache artifacts %s (%s).", path, error)
        return unless
    return saved[0]


def load_artifacts(path: Path) -> bytes | None:
    """Loads the portable artifacts at ``path`` into torch's caches (``torch.compiler.load_cache_artifacts``) and the
    kernels beside them into the policy's folder; returns the artifacts, ``None`` when there are none, the policy is
    off, or they do not load (logged: the job then compiles what they lack)."""
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    if load is None or runtime.compile_cache_root() is None or not path.is_file():
        return None
    folder = os.environ.get(TORCH_CACHE_ENV, "")
    try:
        artifacts = path.read_bytes()
        if load(artifacts) is None:
            raise ValueError("torch could not read them")
        if folder and _kernels(path).is_file():
            with tarfile.open(_kernels(path)) as tar:
                for member in tar.getmembers():
                    kernel = Path(folder, member.name)
                    if _safe(member) and not kernel.exists() and (data := tar.extractfile(member)) is not None:
                        kernel.parent.mkdir(exist_ok=True)
                        _write(kernel, data.read())  # whole or not at all: a node's ranks load at once
    except Exception as error:  # and whatever its deserializer or tarfile meets in a damaged or foreign file
        log.warning("lightning_gaudi: the compile cache artifacts %s did not load (%s); compiling cold.", path, error)
        return None
    return artifacts


def _write(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def strategy_key(strategy: Any) -> tuple[str, dict[str, Any]]:
    """:func:`cache_key` of a Lightning or Fabric strategy: its class, world size and precision on this device."""
    plugin = getattr(strategy, "precision_plugin", None) or getattr(strategy, "precision", None)
    precision = str(getattr(plugin, "precision", type(plugin).__name__))
    world_size = int(getattr(strategy, "world_size", 1))
    return cache_key(hpu.get_backend().device_name(), world_size, type(strategy).__name__, precision)
