"""The resume policy as the Hydra example and the CLI use it: ``ckpt_path`` auto / last / a path, resolved in the
ModelCheckpoint callback's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gaudi.checkpoint_io import atomic_torch_save
from lightning_gaudi.resume import resolve_in_checkpoint_dir


def test_auto_starts_fresh_then_resumes_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts")
    assert resolve_in_checkpoint_dir("auto", checkpoint) is None  # the folder does not exist yet: a first run
    atomic_torch_save({"step": 1}, tmp_path / "ckpts" / "step1.ckpt")
    newest = tmp_path / "ckpts" / "step2.ckpt"
    atomic_torch_save({"step": 2}, newest)
    (tmp_path / "ckpts" / "step3.ckpt").write_bytes(b"PK\x03\x04 truncated")  # newer, but incomplete
    assert resolve_in_checkpoint_dir("auto", checkpoint) == str(newest)


def test_last_and_paths_must_exist(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no last\.ckpt"):
        resolve_in_checkpoint_dir("last", checkpoint)
    torch.save({}, tmp_path / "last.ckpt")
    assert resolve_in_checkpoint_dir("last", checkpoint) == str(tmp_path / "last.ckpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_in_checkpoint_dir(str(tmp_path / "missing.ckpt"), checkpoint)


def test_without_a_checkpoint_callback(tmp_path: Path) -> None:
    assert resolve_in_checkpoint_dir("auto", None) is None  # nothing is saved, so there is nothing to resume
    assert resolve_in_checkpoint_dir(None, None) is None
    assert resolve_in_checkpoint_dir("auto", ModelCheckpoint()) is None  # its folder is decided at fit time
    with pytest.raises(ValueError, match="no `dirpath`"):
        resolve_in_checkpoint_dir("last", None)
