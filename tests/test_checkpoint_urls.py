"""Checkpoints behind fsspec URLs through a real Trainer: ``ModelCheckpoint(dirpath="memory://...")`` on the HPU
saves into fsspec's memory file system, rotates there, and the ``auto`` resume policy continues from it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gaudi import hpu
from lightning_gaudi.resume import resolve_in_checkpoint_dir


@pytest.fixture
def memory_dir() -> Iterator[str]:
    root = f"/checkpoint-urls-{os.getpid()}-{secrets.token_hex(4)}"
    yield f"memory://{root}/ckpts"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _fit(dirpath: str, max_steps: int, ckpt_path: str | None) -> tuple[Trainer, ModelCheckpoint]:
    checkpoint = ModelCheckpoint(
        dirpath=dirpath, filename="{step}", every_n_train_steps=1, save_top_k=1, save_last=True
    )
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        callbacks=[checkpoint],
        **trainer_kwargs(max_steps=max_steps, enable_checkpointing=True),
    )
    resolved = resolve_in_checkpoint_dir(ckpt_path, checkpoint)
    trainer.fit(RegressionModel(), ckpt_path=resolved)
    return trainer, checkpoint


def test_checkpoints_reach_the_url_and_auto_resumes_from_it(
    eager_hpu: hpu.Backend, memory_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    trainer, _ = _fit(memory_dir, max_steps=3, ckpt_path="auto")
    assert trainer.global_step == 3
    assert list(tmp_path.iterdir()) == []  # no local "memory:" folder
    # save_top_k=1 removed step=1 and step=2 through the checkpoint IO's remove_checkpoint, in the memory file system
    assert sorted(os.path.basename(p) for p in fs.ls(memory_dir, detail=False)) == ["last.ckpt", "step=3.ckpt"]
    with fs.open(f"{memory_dir}/step=3.ckpt", "rb") as f:
        saved = torch.load(f, weights_only=False)
    assert saved["global_step"] == 3

    resumed, checkpoint = _fit(memory_dir, max_steps=5, ckpt_path="auto")
    assert resumed.global_step == 5
    assert resumed.ckpt_path == f"{memory_dir}/last.ckpt"  # step 3 like step=3.ckpt, and saved after it
    assert checkpoint.best_model_path == f"{memory_dir}/step=5.ckpt"
    assert sorted(os.path.basename(p) for p in fs.ls(memory_dir, detail=False)) == ["last.ckpt", "step=5.ckpt"]
    assert list(tmp_path.iterdir()) == []
