"""Byte-level language-modelling data from the Python standard library's own source files.

Every machine that runs this package has these files, so the example trains on real text without a download.
The files are read from the running interpreter's installation (``sysconfig.get_paths()["stdlib"]``), sorted by
relative path, and split into train and validation *by file* (a stable hash of the path), so the split is the same
on every run and no validation text leaks into training. Each sample is ``seq_len + 1`` consecutive bytes cut into
an input and a next-byte target; batches are fixed-size (``drop_last``) so shapes stay static on Gaudi.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

#: Directories under the standard library that hold third-party or test code, not the library itself.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
VOCAB_SIZE = 256


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """The ``.py`` files of the standard library under ``root`` (the running interpreter's by default), sorted.

    Raises:
        FileNotFoundError: ``root`` holds no Python source files.
    """
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        path
        for path in base.rglob("*.py")
        if not _SKIPPED_DIRS.intersection(path.relative_to(base).parts[:-1]) and path.is_file()
    )
    if not files:
        raise FileNotFoundError(
            f"No Python source files under {str(base)!r}. Pass `root=` pointing at a directory of .py files (the"
            " standard library of this interpreter normally lives at sysconfig.get_paths()['stdlib'])."
        )
    return files


def _is_validation(relative_path: str, val_fraction: float) -> bool:
    return zlib.crc32(relative_path.encode()) % 10_000 < val_fraction * 10_000


class ByteChunks(Dataset[tuple[Tensor, Tensor]]):
    """Non-overlapping windows of ``seq_len + 1`` bytes from one byte stream, as (input, next-byte target) pairs."""

    def __init__(self, data: Tensor, seq_len: int) -> None:
        if data.numel() < seq_len + 1:
            raise ValueError(f"{data.numel()} bytes cannot fill one sample of seq_len={seq_len} (+1 for the target).")
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (self.data.numel() - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.seq_len
        window = self.data[start : start + self.seq_len + 1].long()
        return window[:-1], window[1:]


class StdlibTextDataModule(L.LightningDataModule):
    """Byte-level text from the standard library's sources, split by file into train and validation.

    Args:
        seq_len: bytes per sample (the model's context length).
        batch_size: samples per batch on each device; the last partial batch is dropped.
        max_bytes: read at most this many bytes of training text (``None`` for all of it); the validation text is
            capped at ``max_bytes * val_fraction``. Smaller is faster to load and to finish an epoch.
        val_fraction: the share of files held out for validation.
        num_workers: data loader worker processes.
        pin_memory: pin host batches for faster copies to the device (Gaudi's advice; no effect in emulation).
        seed: seeds the training sampler's shuffle.
        root: a directory of ``.py`` files to read instead of the running interpreter's standard library.
    """

    def __init__(
        self,
        seq_len: int = 128,
        batch_size: int = 32,
        max_bytes: int | None = 4_000_000,
        val_fraction: float = 0.05,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 1234,
        root: str | None = None,
    ) -> None:
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must both be positive.")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1 (exclusive).")
        if max_bytes is not None and max_bytes < seq_len + 1:
            raise ValueError(f"max_bytes={max_bytes} is smaller than one sample ({seq_len + 1} bytes).")
        self.save_hyperparameters()
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.val_fraction = val_fraction
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.root = root
        self.train_set: ByteChunks | None = None
        self.val_set: ByteChunks | None = None

    @property
    def vocab_size(self) -> int:
        """Byte-level: 256 symbols."""
        return VOCAB_SIZE

    def _read(self) -> tuple[Tensor, Tensor]:
        base = Path(self.root) if self.root is not None else Path(sysconfig.get_paths()["stdlib"])
        val_cap = None if self.max_bytes is None else max(int(self.max_bytes * self.val_fraction), self.seq_len + 1)
        caps = {False: self.max_bytes, True: val_cap}
        parts: dict[bool, list[bytes]] = {False: [], True: []}
        sizes = {False: 0, True: 0}

        def full(held_out: bool) -> bool:
            cap = caps[held_out]
            return cap is not None and sizes[held_out] >= cap

        for path in stdlib_source_files(base):
            held_out = _is_validation(path.relative_to(base).as_posix(), self.val_fraction)
            if full(held_out):
                if full(not held_out):
                    break
                continue
            text = path.read_bytes() + b"\n\n"
            parts[held_out].append(text)
            sizes[held_out] += len(text)
        train, val = (b"".join(parts[k])[: caps[k]] for k in (False, True))
        if len(val) < self.seq_len + 1:
            raise ValueError(
                f"Only {len(val)} validation bytes under {str(base)!r} (val_fraction={self.val_fraction});"
                f" raise val_fraction or max_bytes, or lower seq_len={self.seq_len}."
            )
        return (
            torch.frombuffer(bytearray(train), dtype=torch.uint8),
            torch.frombuffer(bytearray(val), dtype=torch.uint8),
        )

    def setup(self, stage: str) -> None:
        """Reads the sources once per process (they are on every machine, so there is nothing to download)."""
        if self.train_set is None:
            train, val = self._read()
            self.train_set = ByteChunks(train, self.seq_len)
            self.val_set = ByteChunks(val, self.seq_len)

    def _loader(self, dataset: ByteChunks | None, shuffle: bool) -> DataLoader[tuple[Tensor, Tensor]]:
        if dataset is None:
            raise RuntimeError("StdlibTextDataModule.setup() must run before asking for a data loader.")
        if len(dataset) < self.batch_size:
            raise ValueError(
                f"{len(dataset)} samples cannot fill one batch of {self.batch_size} with drop_last; lower batch_size"
                " or seq_len, or raise max_bytes."
            )
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=True,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            generator=generator,
        )

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return self._loader(self.val_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return self._loader(self.val_set, shuffle=False)
