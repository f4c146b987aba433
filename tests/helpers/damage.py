"""Checkpoints damaged on purpose (and their fingerprints), for the resume tests."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import torch


def make_unloadable(path: Path) -> None:
    """Rewrites the ``torch.save`` file ``path`` so that it verifies (whole, CRC-32s right, its pickle parses) but does
    not load: it holds an object of a class whose module is gone (a checkpoint of another version of the code)."""
    module = types.ModuleType("lightning_gaudi_vanished")
    exec("class Gone:\n    pass", module.__dict__)
    module.Gone.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        checkpoint = torch.load(path, weights_only=False)
        checkpoint["gone"] = module.Gone()
        torch.save(checkpoint, path)
    finally:
        del sys.modules[module.__name__]


def flip_bytes(path: Path, count: int = 8) -> None:
    """Inverts the first ``count`` bytes of the file ``path``, keeping its length (a shard torch's reader fails on)."""
    data = bytearray(path.read_bytes())
    data[:count] = bytes(b ^ 0xFF for b in data[:count])
    path.write_bytes(bytes(data))


def fingerprint(path: Path) -> dict[str, str]:
    """The sha256 of each file of the checkpoint ``path`` (a file or a folder), by its path relative to ``path``."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


class Payload:
    """Unpickled without restriction, it makes the folder ``marker`` (standing for code a planted checkpoint runs)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        import os

        return os.makedirs, (self.marker, 0o777, True)


def plant_payload(path: Path, marker: Path) -> None:
    """Rewrites the ``torch.save`` file ``path`` (whole, its CRC-32s right) to also hold a :class:`Payload`."""
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["planted"] = Payload(marker)
    torch.save(checkpoint, path)


def plant_in_metadata(folder: Path, marker: Path) -> None:
    """Rewrites the torch distributed checkpoint ``folder``'s ``.metadata`` to also hold a :class:`Payload`, and its
    checksum index to match (as whoever plants it would)."""
    import json
    import pickle
    import zlib

    path = folder / ".metadata"
    with path.open("rb") as f:
        metadata = pickle.load(f)
    metadata.planted = Payload(marker)
    path.write_bytes(pickle.dumps(metadata))
    index_path = folder / ".checksums"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        data = path.read_bytes()
        index["files"][".metadata"] = {"crc32": f"{zlib.crc32(data):08x}", "size": len(data)}
        index_path.write_text(json.dumps(index))
