"""A restart never crash-loops on a checkpoint: one that the resume policy chose and that fails to load is moved aside
(renamed, never deleted) and the next newest that verifies is loaded instead, to the uninterrupted run's result.

In one process (one rank); the 2-process cases are in ``tests/strategies/test_fsdp_emulated.py`` and
``tests/strategies/test_deepspeed_emulated.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.damage import flip_bytes, make_unloadable
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gaudi import HPUFSDPStrategy, SingleHPUStrategy, hpu, resume
from lightning_gaudi.checkpoint_io import atomic_torch_save
from lightning_gaudi.distributed import PeerLostError
from lightning_gaudi.strategies._staged import METADATA_FILENAME


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    """The one-rank process group a sharded fit forms stays after it: gone before the next test."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


EPOCHS = 3  # a checkpoint at the end of each: resuming from any of them repeats the uninterrupted run exactly


def _fit(root: Path, strategy: Any, epochs: int = EPOCHS, ckpt_path: str | None = None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = RegressionModel()
    callback = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_epochs=1)
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        strategy=strategy(),
        default_root_dir=root,
        callbacks=[callback],
        **trainer_kwargs(max_steps=-1, max_epochs=epochs, enable_checkpointing=True),
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    assert trainer.current_epoch == epochs
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _assert_same(resumed: dict[str, torch.Tensor], uninterrupted: dict[str, torch.Tensor]) -> None:
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_file_checkpoint_that_fails_to_load_is_moved_aside(
    eager_hpu: hpu.Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uninterrupted = _fit(tmp_path / "straight", SingleHPUStrategy)
    run = tmp_path / "run"
    _fit(run, SingleHPUStrategy, epochs=2)
    ckpt = run / "ckpt"
    newest = ckpt / "epoch=1-step=16.ckpt"
    make_unloadable(newest)
    assert resume.verify_checkpoint(newest).global_step == 16  # nothing in its bytes tells
    chosen = resume.resolve_ckpt_path("auto", ckpt)
    assert chosen == str(newest)
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        resumed = _fit(run, SingleHPUStrategy, ckpt_path=chosen)
    _assert_same(resumed, uninterrupted)
    aside = Path(f"{newest}.unloadable")
    assert aside.is_file()  # moved, not deleted
    lines = [r.getMessage() for r in caplog.records if "could not load" in r.getMessage()]
    assert len(lines) == 1
    assert str(newest) in lines[0]
    assert str(aside) in lines[0]
    assert "resuming from" in lines[0]
    assert str(ckpt / "epoch=0-step=8.ckpt") in lines[0]
    # the next restart does not see it
    assert resume.resolve_ckpt_path("auto", ckpt) == str(ckpt / "epoch=2-step=24.ckpt")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_checkpoint_given_by_path_is_not_moved(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    _fit(tmp_path, SingleHPUStrategy, epochs=1)
    checkpoint = tmp_path / "ckpt" / "epoch=0-step=8.ckpt"
    make_unloadable(checkpoint)
    with pytest.raises(Exception, match="lightning_gaudi_vanished"):
        _fit(tmp_path, SingleHPUStrategy, ckpt_path=str(checkpoint))
    assert checkpoint.is_file()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_when_no_checkpoint_loads_each_is_moved_aside_and_the_error_says_so(
    eager_hpu: hpu.Backend, tmp_path: Path
) -> None:
    _fit(tmp_path, SingleHPUStrategy, epochs=2)
    ckpt = tmp_path / "ckpt"
    for path in ckpt.iterdir():
        make_unloadable(path)
    with pytest.raises(
        resume.CheckpointDamagedError, match=r"(?s)unloadable.*a restart with ckpt_path='auto' starts fresh"
    ):
        _fit(tmp_path, SingleHPUStrategy, ckpt_path=resume.resolve_ckpt_path("auto", ckpt))
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "epoch=0-step=8.ckpt.unloadable",
        "epoch=1-step=16.ckpt.unloadable",
    ]
    assert resume.resolve_ckpt_path("auto", ckpt) is None


def _sharded() -> HPUFSDPStrategy:
    return HPUFSDPStrategy(state_dict_type="sharded")


def _damage_a_shard(folder: Path) -> None:
    """Overwrites 8 bytes at the start of the shard, keeping its length: torch's reader fails on it."""
    flip_bytes(folder / "__0_0.distcp")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("checksums", [True, False], ids=["checksummed", "older-without-checksums"])
def test_a_damaged_sharded_checkpoint_resumes_from_the_intact_older_one(
    eager_hpu: hpu.Backend, tmp_path: Path, checksums: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Checksummed: the policy skips the damaged folder. Older, without checksums: it verifies, fails to load, and is
    moved aside. Either way the run resumes from the intact older checkpoint to the uninterrupted result."""
    uninterrupted = _fit(tmp_path / "straight", _sharded)
    run = tmp_path / "run"
    _fit(run, _sharded, epochs=2)
    ckpt = run / "ckpt"
    newest = ckpt / "epoch=1-step=16.ckpt"
    assert (newest / METADATA_FILENAME).is_file()
    _damage_a_shard(newest)
    if not checksums:
        (newest / resume.CHECKSUMS_FILENAME).unlink()
    chosen = resume.resolve_ckpt_path("auto", ckpt)
    assert chosen == str(ckpt / "epoch=0-step=8.ckpt" if checksums else newest)
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        resumed = _fit(run, _sharded, ckpt_path=chosen)
    _assert_same(resumed, uninterrupted)
    moved = [r.getMessage() for r in caplog.records if "could not load" in r.getMessage()]
    if checksums:
        assert not moved
        assert newest.is_dir()
    else:
        assert len(moved) == 1
        assert str(newest) in moved[0]
        assert Path(f"{newest}.unloadable").is_dir()


class _OneRank:
    is_global_zero = True

    @staticmethod
    def reduce_boolean_decision(decision: bool, all: bool = True) -> bool:
        return decision

    @staticmethod
    def broadcast(obj: Any, src: int = 0) -> Any:
        return obj

    @staticmethod
    def barrier(name: str | None = None) -> None:
        return None


def _two_checkpoints(root: str) -> tuple[str, str]:
    older, newer = f"{root}/epoch=0-step=2.ckpt", f"{root}/epoch=0-step=4.ckpt"
    atomic_torch_save({"global_step": 2, "epoch": 0}, older)
    atomic_torch_save({"global_step": 4, "epoch": 0}, newer)
    return older, newer


def _load_all_but(bad: str) -> Any:
    def load(path: str) -> dict[str, Any]:
        if path == bad:
            raise RuntimeError("cannot load this one")
        return {"loaded": path}

    return load


def test_the_fallback_on_an_fsspec_url() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    older, newer = _two_checkpoints("memory://fallback")
    try:
        chosen = resume.resolve_ckpt_path("auto", "memory://fallback")
        assert chosen == newer
        assert resume.load_or_fall_back(_OneRank(), chosen, _load_all_but(newer)) == {"loaded": older}
        assert fs.exists(f"/fallback/epoch=0-step=4.ckpt{resume.UNLOADABLE_SUFFIX}")
        assert not fs.exists("/fallback/epoch=0-step=4.ckpt")
    finally:
        fs.rm("/fallback", recursive=True)


def test_a_checkpoint_that_cannot_be_moved_aside_fails_as_without_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, newer = _two_checkpoints(str(tmp_path))
    chosen = resume.resolve_ckpt_path("auto", tmp_path)

    def refuse(*args: Any) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(resume.os, "rename", refuse)
    with pytest.raises(RuntimeError, match="cannot load this one"):
        resume.load_or_fall_back(_OneRank(), chosen, _load_all_but(newer))
    assert Path(newer).is_file()


def test_a_lost_peer_is_no_fault_of_the_checkpoint(tmp_path: Path) -> None:
    _, newer = _two_checkpoints(str(tmp_path))
    chosen = resume.resolve_ckpt_path("auto", tmp_path)

    def load(path: str) -> dict[str, Any]:
        raise PeerLostError("Connection closed by peer")

    with pytest.raises(PeerLostError):
        resume.load_or_fall_back(_OneRank(), chosen, load)
    assert Path(newer).is_file()
