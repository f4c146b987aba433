"""Canary of the ``fabric_checkpoint_writer`` patch: Fabric's sharded saves go through the writer given, and through
Lightning's own function otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning.fabric.strategies import fsdp as fabric_fsdp
from lightning.fabric.strategies import model_parallel as fabric_model_parallel

from lightning_gaudi.patches import fabric_checkpoint_writer
from lightning_gaudi.strategies._staged import ChecksummedWriter


def test_lightning_is_as_checked() -> None:
    assert fabric_checkpoint_writer.missing_targets() == []
    assert fabric_checkpoint_writer.installed()


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's single-process warning for distributed checkpoints
@pytest.mark.parametrize("module", [fabric_fsdp, fabric_model_parallel], ids=["fsdp", "model_parallel"])
def test_fabric_saves_write_through_the_writer_given(tmp_path: Path, module: object) -> None:
    save = module._distributed_checkpoint_save  # type: ignore[attr-defined]
    state = {"model": {"w": torch.arange(16.0)}}
    with fabric_checkpoint_writer.storage_writer(ChecksummedWriter) as writers:
        save(state, tmp_path / "with")
    assert len(writers) == 1
    writers[0].write_checksums(0)
    written = json.loads((tmp_path / "with" / ".checksums-rank0").read_text())
    assert set(written) == {".metadata", "__0_0.distcp"}
    assert written["__0_0.distcp"]["size"] == (tmp_path / "with" / "__0_0.distcp").stat().st_size
    save(state, tmp_path / "without")  # outside: Lightning's function, torch's own writer
    assert sorted(p.name for p in (tmp_path / "without").iterdir()) == [".metadata", "__0_0.distcp"]
    assert writers == [writers[0]]
