"""Resume policy, in one process.

The restart-proof process-group handshake and the collective errors are tested in ``tests/distributed/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lightning_gaudi import resume
from lightning_gaudi.checkpoint_io import atomic_torch_save


def _save(path: Path, step: int, mtime: float) -> Path:
    atomic_torch_save({"global_step": step, "w": torch.arange(1000.0)}, path)
    os.utime(path, (mtime, mtime))
    return path


def _truncate(source: Path, target: Path, mtime: float) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    os.utime(target, (mtime, mtime))
    return target


def test_complete_and_truncated_checkpoints(tmp_path: Path) -> None:
    whole = _save(tmp_path / "a.ckpt", 1, 1000)
    half = _truncate(whole, tmp_path / "b.ckpt", 2000)
    assert resume.is_complete_checkpoint(whole)
    assert not resume.is_complete_checkpoint(half)
    assert not resume.is_complete_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert not resume.is_complete_checkpoint(tmp_path / "empty.ckpt")
    os.symlink("gone.ckpt", tmp_path / "dangling.ckpt")
    assert not resume.is_complete_checkpoint(tmp_path / "dangling.ckpt")


def test_auto_picks_the_newest_complete_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert resume.resolve_ckpt_path("auto", tmp_path / "not-yet") is None  # first run: start fresh
    assert resume.resolve_ckpt_path("auto", tmp_path) is None
    old = _save(tmp_path / "step=5.ckpt", 5, 1000)
    new = _save(tmp_path / "step=10.ckpt", 10, 2000)
    _truncate(new, tmp_path / "step=15.ckpt", 3000)  # newest, but cut short
    (tmp_path / ".step=20.ckpt.abc.tmp").write_bytes(b"partial")  # what an interrupted atomic save leaves
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(new)
    assert "skipping incomplete checkpoint" in caplog.text
    assert resume.latest(tmp_path) == str(new)
    os.utime(old, (4000, 4000))
    assert resume.latest(tmp_path) == str(old)


def test_last_policy(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no last.ckpt in .*save_last=True.*'auto'"):
        resume.resolve_ckpt_path("last", tmp_path)
    target = _save(tmp_path / "step=10.ckpt", 10, 1000)
    os.symlink(target.name, tmp_path / "last.ckpt")  # ModelCheckpoint(save_last="link")
    assert resume.resolve_ckpt_path("last", tmp_path) == str(tmp_path / "last.ckpt")
    _save(tmp_path / "last-v1.ckpt", 12, 2000)
    assert resume.resolve_ckpt_path("last", tmp_path) == str(tmp_path / "last-v1.ckpt")
    _truncate(target, tmp_path / "last-v1.ckpt", 3000)
    with pytest.raises(ValueError, match=r"last-v1.ckpt' is incomplete"):
        resume.resolve_ckpt_path("last", tmp_path)


def test_explicit_paths_and_bad_input(tmp_path: Path) -> None:
    assert resume.resolve_ckpt_path(None, tmp_path) is None
    whole = _save(tmp_path / "x.ckpt", 1, 1000)
    assert resume.resolve_ckpt_path(whole) == str(whole)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        resume.resolve_ckpt_path(tmp_path / "nope.ckpt")
    with pytest.raises(ValueError, match=r"is incomplete"):
        resume.resolve_ckpt_path(_truncate(whole, tmp_path / "y.ckpt", 1))
    with pytest.raises(ValueError, match=r"policy 'auto' .* no `dirpath`"):
        resume.resolve_ckpt_path("auto")
    with pytest.raises(NotADirectoryError, match=r"is a file"):
        resume.latest(whole)
