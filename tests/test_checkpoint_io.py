"""HPUCheckpointIO: CPU tensors in the file, atomic writes, and a round trip between the HPU and the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer

from lightning_gaudi import HPUCheckpointIO, hpu
from lightning_gaudi.checkpoint_io import atomic_torch_save


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors(value)]
    return []


def test_tensors_are_moved_to_the_cpu(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    device = lazy_hpu.device()
    weight = torch.arange(6.0).reshape(2, 3).to(device)
    checkpoint = {"state_dict": {"w": weight}, "optimizer_states": [{"m": [weight * 2]}], "epoch": 3}
    HPUCheckpointIO().save_checkpoint(checkpoint, tmp_path / "sub" / "c.ckpt")
    assert weight.device.type == "lazy"  # the caller's tensors stay where they were
    loaded = torch.load(tmp_path / "sub" / "c.ckpt", weights_only=True)
    assert all(t.device.type == "cpu" for t in _tensors(loaded))
    torch.testing.assert_close(loaded["state_dict"]["w"], torch.arange(6.0).reshape(2, 3))
    torch.testing.assert_close(loaded["optimizer_states"][0]["m"][0], 2 * torch.arange(6.0).reshape(2, 3))
    assert loaded["epoch"] == 3


def test_round_trip_hpu_to_cpu_and_back(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    """Saved from the (lazy-emulated) HPU, loaded on the CPU, resumed on the HPU."""
    model = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=-1, max_epochs=1, limit_train_batches=2))
    trainer.fit(model)
    path = tmp_path / "hpu.ckpt"
    trainer.save_checkpoint(path)
    assert not list(tmp_path.glob("*.tmp"))

    raw = torch.load(path, weights_only=False)
    assert all(t.device.type == "cpu" for t in _tensors(raw["state_dict"]))
    assert all(t.device.type == "cpu" for t in _tensors(raw["optimizer_states"]))

    on_cpu = RegressionModel.load_from_checkpoint(path, map_location="cpu")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(on_cpu.state_dict()[name], tensor.cpu())

    resumed = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=-1, max_epochs=2, limit_train_batches=2))
    trainer.fit(resumed, ckpt_path=path)
    assert trainer.global_step == 4
    assert resumed.seen["param_device"] == "lazy"


def test_trainer_checkpoints_go_through_hpu_checkpoint_io(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trainer.save_checkpoint`` on an HPU strategy writes through HPUCheckpointIO's atomic writer: the file is
    complete, holds CPU tensors, and loads on a CPU-only Trainer."""
    written: list[Path] = []
    real = atomic_torch_save

    def spy(obj: object, path: Path) -> None:
        written.append(Path(path))
        real(obj, path)

    monkeypatch.setattr("lightning_gaudi.checkpoint_io.atomic_torch_save", spy)
    model = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=1))
    trainer.fit(model)
    path = tmp_path / "manual.ckpt"
    trainer.save_checkpoint(path)
    assert written == [path]
    loaded = torch.load(path, weights_only=True)
    assert all(t.device.type == "cpu" for t in _tensors(loaded))
    assert loaded["global_step"] == 1
    resumed = RegressionModel()
    cpu_trainer = Trainer(accelerator="cpu", **trainer_kwargs(max_steps=2))
    cpu_trainer.fit(resumed, ckpt_path=str(path))
    assert cpu_trainer.global_step == 2


def test_failed_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.ckpt"
    atomic_torch_save({"w": torch.ones(2)}, path)
    before = path.read_bytes()

    def broken_save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        f.write(b"half a checkpoint")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"w": torch.zeros(2)}, path)
    assert path.read_bytes() == before  # the old checkpoint is untouched
    with pytest.raises(OSError, match="disk full"):
        HPUCheckpointIO().save_checkpoint({"w": torch.zeros(2)}, tmp_path / "new.ckpt")
    assert not (tmp_path / "new.ckpt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # no temporary file left behind


def test_storage_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        HPUCheckpointIO().save_checkpoint({}, tmp_path / "c.ckpt", storage_options={"x": 1})
    assert not (tmp_path / "c.ckpt").exists()
