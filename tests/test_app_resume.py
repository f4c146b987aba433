"""The Hydra app's resume policy: ``ckpt_path`` auto / last / a path, resolved in the ModelCheckpoint folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gaudi.app import resume_from
from lightning_gaudi.checkpoint_io import atomic_torch_save


def test_auto_starts_fresh_then_resumes_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    callbacks = [ModelCheckpoint(dirpath=tmp_path / "ckpts")]
    assert resume_from("auto", callbacks) is None  # the folder does not exist yet: a first run
    atomic_torch_save({"step": 1}, tmp_path / "ckpts" / "step1.ckpt")
    newest = tmp_path / "ckpts" / "step2.ckpt"
    atomic_torch_save({"step": 2}, newest)
    (tmp_path / "ckpts" / "step3.ckpt").write_bytes(b"PK\x03\x04 truncated")  # newer, but incomplete
    assert resume_from("auto", callbacks) == str(newest)


def test_last_and_paths_must_exist(tmp_path: Path) -> None:
    callbacks = [ModelCheckpoint(dirpath=tmp_path)]
    with pytest.raises(FileNotFoundError, match=r"no last\.ckpt"):
        resume_from("last", callbacks)
    torch.save({}, tmp_path / "last.ckpt")
    assert resume_from("last", callbacks) == str(tmp_path / "last.ckpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resume_from(str(tmp_path / "missing.ckpt"), callbacks)


def test_without_a_checkpoint_callback(tmp_path: Path) -> None:
    assert resume_from("auto", []) is None  # nothing is saved, so there is nothing to resume
    assert resume_from(None, []) is None
    with pytest.raises(ValueError, match="no `dirpath`"):
        resume_from("last", [])
