"""Resume never runs code from a checkpoint: a planted payload (a pickle whose unpickling makes a marker folder) never
runs, under ``"auto"`` (moved aside, the run resumes from the older checkpoint) nor by path (refused, naming
``weights_only=False``), for each kind of checkpoint the strategies load; the messages fit the call.

In one process (one rank): the strategies' own loading paths, each started by a real ``Trainer``.
"""

from __future__ import annotations

import io
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from helpers.damage import Payload, plant_in_metadata, plant_payload
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUFSDPStrategy, SingleHPUStrategy, hpu, resume
from lightning_gaudi.safe_load import WeightsOnlyReader, check_weights_only


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


class _Momentum(RegressionModel):
    """With optimizer state: Lightning's full-state-dict FSDP resume indexes the first state (none for plain SGD)."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    def test_dataloader(self) -> Any:
        return self.train_dataloader()


def _fit(root: Path, strategy: Callable[[], Any], epochs: int, ckpt_path: str | None = None, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        strategy=strategy(),
        default_root_dir=root,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_epochs=1)],
        **trainer_kwargs(max_steps=-1, max_epochs=epochs, enable_checkpointing=True),
    )
    trainer.fit(_Momentum(), ckpt_path=ckpt_path, **kw)
    return trainer


def _deepspeed() -> Any:
    from lightning_gaudi import HPUDeepSpeedStrategy

    return HPUDeepSpeedStrategy(stage=2)


def _plant_deepspeed(folder: Path, marker: Path) -> None:
    plant_payload(folder / "checkpoint" / "mp_rank_00_model_states.pt", marker)


FAMILIES = [
    pytest.param(lambda: HPUFSDPStrategy(state_dict_type="full"), plant_payload, id="fsdp-full-file"),
    pytest.param(lambda: HPUFSDPStrategy(state_dict_type="sharded"), plant_in_metadata, id="fsdp-sharded-dcp-folder"),
    pytest.param(
        _deepspeed,
        _plant_deepspeed,
        id="deepspeed-folder",
        marks=pytest.mark.skipif(not RequirementCache("deepspeed"), reason="DeepSpeed is not installed"),
    ),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("strategy", "plant"), FAMILIES)
def test_a_planted_payload_never_runs_by_path_nor_under_auto(
    eager_hpu: hpu.Backend, tmp_path: Path, strategy: Callable[[], Any], plant: Callable[[Path, Path], None]
) -> None:
    _fit(tmp_path, strategy, epochs=2)
    ckpt = tmp_path / "ckpt"
    planted, older = ckpt / "epoch=1-step=16.ckpt", ckpt / "epoch=0-step=8.ckpt"
    marker = tmp_path / "payload-ran"
    plant(planted, marker)
    assert resume.verify_checkpoint(planted).global_step == 16  # its bytes are whole: verification passes

    with pytest.raises(resume.UntrustedCheckpointError, match=r"planted|Payload|makedirs") as refused:
        _fit(tmp_path, strategy, epochs=3, ckpt_path=str(planted))
    assert not marker.exists(), "the planted payload ran"
    assert "trainer.fit(..., ckpt_path=..., weights_only=False)" in str(refused.value)
    assert planted.exists()  # given by path: never moved

    chosen = resume.resolve_ckpt_path("auto", ckpt)
    assert chosen == str(planted)
    trainer = _fit(tmp_path, strategy, epochs=3, ckpt_path=chosen)
    assert not marker.exists(), "the planted payload ran"
    assert Path(f"{planted}.unloadable").exists()  # moved aside, passed over
    assert trainer.global_step == 24  # resumed from the older checkpoint (step 8) for 2 epochs of 8 steps
    assert older.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_test_on_a_checkpoint_of_objects_names_weights_only_for_test_not_resuming(
    eager_hpu: hpu.Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Hyperparameters holding objects (lightning-hydra-template's): ``trainer.test`` is told how to trust the file,
    not to resume from another checkpoint; with ``weights_only=False`` it loads."""
    _fit(tmp_path, SingleHPUStrategy, epochs=1)
    path = tmp_path / "ckpt" / "epoch=0-step=8.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["hyper_parameters"] = {"optimizer": Payload(tmp_path / "unused")}
    torch.save(checkpoint, path)
    trainer = Trainer(accelerator="hpu", devices=1, strategy=SingleHPUStrategy(), **trainer_kwargs())
    with caplog.at_level("ERROR", logger="lightning_gaudi.resume"), pytest.raises(resume.UntrustedCheckpointError) as e:
        trainer.test(_Momentum(), ckpt_path=str(path), verbose=False)
    message = str(e.value) + " ".join(r.getMessage() for r in caplog.records)
    assert "trainer.test(..., ckpt_path=..., weights_only=False)" in message
    assert "Resume from" not in message
    assert "ckpt_path='auto'" not in message
    assert not (tmp_path / "unused").exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_damaged_pickle_passed_to_fit_says_what_is_wrong_not_weights_only(
    eager_hpu: hpu.Backend, tmp_path: Path
) -> None:
    _fit(tmp_path, SingleHPUStrategy, epochs=1)
    path = tmp_path / "ckpt" / "epoch=0-step=8.ckpt"
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename.endswith("/data.pkl"):
                data = data[: len(data) // 2]  # CRC-32 recomputed: only the pickle is damaged
            target.writestr(member, data)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(resume.CheckpointDamagedError) as damaged:
        _fit(tmp_path, SingleHPUStrategy, epochs=2, ckpt_path=str(path))
    assert "weights_only" not in str(damaged.value)
    assert "Resume from an earlier checkpoint" in str(damaged.value)  # fit resumes: the advice fits


def test_dcp_metadata_and_entries_are_read_weights_only(tmp_path: Path) -> None:
    """torch's reader unpickles ``.metadata`` as it is, and its planner the non-tensor entries with
    ``weights_only=False`` (tensor-parallel and FSDP2 folders load through it)."""
    folder = tmp_path / "dcp"
    state = {"weight": torch.ones(2), "extra": {"lr": 0.5}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=folder)
    check_weights_only(str(folder))  # what torch writes passes
    loaded = {"weight": torch.zeros(2), "extra": {"lr": 0.0}}
    dcp.load(loaded, storage_reader=WeightsOnlyReader(folder))
    assert loaded["extra"]["lr"] == 0.5
    assert loaded["weight"].sum() == 2

    marker = tmp_path / "payload-ran"
    entries = shutil.copytree(folder, tmp_path / "entries")
    planted = {"weight": torch.ones(2), "extra": {"lr": Payload(marker)}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(planted, checkpoint_id=entries)
    with pytest.raises(resume.UntrustedCheckpointError, match=r"entry 'extra.lr'.*makedirs"):
        check_weights_only(str(entries))
    with pytest.raises(BaseException, match=r"UntrustedCheckpointError.*makedirs"):  # in torch's CheckpointException
        dcp.load({"weight": torch.zeros(2), "extra": {"lr": 0.0}}, storage_reader=WeightsOnlyReader(entries))

    plant_in_metadata(folder, marker)
    with pytest.raises(resume.UntrustedCheckpointError, match=r"makedirs in its shard index \(.metadata\)"):
        check_weights_only(str(folder))
    # refused either way; how torch words it differs (2.13 passes the reader's error on, 2.10: "metadata is None")
    with pytest.raises(BaseException):  # noqa: B017, PT011
        dcp.load({"weight": torch.zeros(2), "extra": {"lr": 0.0}}, storage_reader=WeightsOnlyReader(folder))
    assert not marker.exists(), "the planted payload ran"
