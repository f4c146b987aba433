"""The tuner_oom patch (``lightning_gaudi/patches/tuner_oom.py``): Lightning's batch-size finder backs off on HPU OOM.

An HPU OOM is the bridge's ``RuntimeError`` (gaudi-pytorch-bridge v1.19.0, backend/synapse_helpers/device_memory.cpp
:1060-1065, :data:`DEVMEM_OOM`), on the bridge double and raised by a model under eager emulation. The canaries fail
when Lightning's batch-size scaling stops reading the ``is_oom_error`` the patch replaces.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.tuner import Tuner
from lightning.pytorch.utilities import memory
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.hpu.bridge import HabanaBackend
from lightning_gaudi.patches import registry, tuner_oom

MIB = 1024**2
scaling = importlib.import_module("lightning.pytorch.tuner.batch_size_scaling")
#: What the bridge raises when a card cannot hold 24 MiB more, character for character.
DEVMEM_OOM = "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::25165824 (24)MB"
#: What Lightning takes for a CUDA out-of-memory error.
CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


class DevmemAbove(Workload):
    """A model whose training step raises the bridge's out-of-memory error once its batch exceeds ``fits`` samples
    (at the ``fail_at``-th step and later, counted from 1)."""

    def __init__(self, fits: int, batch_size: int = 2, message: str = DEVMEM_OOM, fail_at: int = 1) -> None:
        super().__init__()
        self.fits, self.batch_size, self.message, self.fail_at = fits, batch_size, message, fail_at
        self.steps = 0
        self.fitted: list[int] = []  # the batch sizes that ran

    def train_dataloader(self) -> Any:
        return loader(4, batch_size=self.batch_size)

    def val_dataloader(self) -> Any:
        return loader(1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.steps += 1
        if len(batch[0]) > self.fits and self.steps >= self.fail_at:
            raise RuntimeError(self.message)
        self.fitted.append(len(batch[0]))
        return super().training_step(batch, batch_idx)


class GraphPerSample(Workload):
    """A model whose ops need 1 MiB of device memory per sample (told to the bridge double)."""

    def __init__(self, state: ModuleType, batch_size: int = 2, error: Exception | None = None) -> None:
        super().__init__()
        self.state = state
        self.batch_size = batch_size
        self.error = error
        self.fitted: list[int] = []  # the batch sizes that ran

    def train_dataloader(self) -> Any:
        return loader(2, batch_size=self.batch_size)

    def val_dataloader(self) -> Any:
        return loader(1)  # the tuner asks for it; validation is off (limit_val_batches=0)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.error is not None and self.batch_size > 2:
            raise self.error
        self.state.run_ops(len(batch[0]) * MIB)
        self.fitted.append(len(batch[0]))
        return super().training_step(batch, batch_idx)


@pytest.fixture
def host_tensor_bridge(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bridge path in eager mode, with tensors on the host: the double cannot hold tensors on an "hpu" device.

    Eager, because Lightning runs the search's trials without callbacks, so lazy mode's MarkStep cuts no graph there.
    """
    monkeypatch.setattr(HabanaBackend, "device_type", "cpu")
    bridge_double.configure(lazy=False, memory={"Limit": 8 * MIB})
    return bridge_double


def test_installed_after_import() -> None:
    assert tuner_oom.installed()
    assert tuner_oom.PATCH.installed()
    assert scaling.is_oom_error is not memory.is_oom_error


def test_lightning_still_reads_the_name() -> None:
    """Canary: the scaling loops look up `is_oom_error` in their module when an error comes."""
    assert tuner_oom.missing_targets() == [], "Lightning's batch-size scaling changed: re-check patches/tuner_oom.py"


def test_lightnings_own_cases_are_kept() -> None:
    assert scaling.is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not scaling.is_oom_error(RuntimeError("shape mismatch"))


#: The largest batch each search runs when 10 samples fit and 11 do not: doubling from 2 stops at 8; the binary
#: search then tries 12, 10 and 11.
SETTLES = {"power": 8, "binsearch": 10}


def assert_settled(size: int, model: Any, mode: str) -> None:
    """The search kept the largest batch that ran (Lightning 2.6's binary search keeps 5% less: ``margin``)."""
    assert max(model.fitted) == SETTLES[mode]
    assert size == model.batch_size
    assert int(SETTLES[mode] * 0.95) <= size <= SETTLES[mode]


@pytest.mark.parametrize("mode", list(SETTLES))
def test_batch_size_search_backs_off_on_hpu_oom(host_tensor_bridge: ModuleType, tmp_path: Path, mode: str) -> None:
    """1 MiB a sample on a 10 MiB card: the double's ops raise the bridge's PT_DEVMEM error above 10 samples."""
    host_tensor_bridge.configure(memory={"Limit": 10 * MIB})
    model = GraphPerSample(host_tensor_bridge)
    trainer = quiet_trainer(default_root_dir=tmp_path)
    assert isinstance(hpu.get_backend(), HabanaBackend)
    size = Tuner(trainer).scale_batch_size(model, mode=mode, steps_per_trial=1, init_val=2, max_trials=8)
    assert_settled(size, model, mode)


@pytest.mark.parametrize("mode", list(SETTLES))
def test_batch_size_search_backs_off_on_the_bridges_oom_in_emulation(
    eager_hpu: hpu.Backend, tmp_path: Path, mode: str
) -> None:
    """A training step that raises the bridge's exact error above 10 samples, as it would on a Gaudi."""
    model = DevmemAbove(fits=10)
    trainer = quiet_trainer(default_root_dir=tmp_path)
    size = Tuner(trainer).scale_batch_size(model, mode=mode, steps_per_trial=1, init_val=2, max_trials=8)
    assert_settled(size, model, mode)
    assert not memory.is_oom_error(RuntimeError(DEVMEM_OOM)), "Lightning recognises it now: re-check the patch"


@pytest.mark.parametrize("message", [DEVMEM_OOM, CUDA_OOM], ids=["hpu", "cuda"])
def test_lr_find_treats_the_bridges_oom_as_lightning_treats_cudas(
    eager_hpu: hpu.Backend, tmp_path: Path, message: str
) -> None:
    """Lightning's learning-rate search does not back off on out of memory: it restores the model and the trainer
    and raises the error unchanged, the bridge's as CUDA's."""
    model = DevmemAbove(fits=2, batch_size=4, message=message, fail_at=3)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    trainer = quiet_trainer(default_root_dir=tmp_path)
    with pytest.raises(RuntimeError) as error:
        Tuner(trainer).lr_find(model, num_training=8, early_stop_threshold=None)
    assert str(error.value) == message
    assert model.steps == 3  # two steps trained, then the error
    after = model.state_dict()
    assert all(torch.equal(value, after[name]) for name, value in before.items()), "the initial weights are back"
    assert not list(tmp_path.glob(".lr_find_*.ckpt")), "its checkpoint is removed"
    assert scaling.is_oom_error(error.value)


def test_other_errors_still_stop_the_search(host_tensor_bridge: ModuleType, tmp_path: Path) -> None:
    model = GraphPerSample(host_tensor_bridge, error=RuntimeError("shape mismatch"))
    trainer = quiet_trainer(default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=1, init_val=2, max_trials=8)


def test_emulation_recognises_the_hosts_out_of_memory(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(RuntimeError) as error:
        torch.empty(2**62, dtype=torch.uint8)  # the host's allocator refuses: a real out-of-memory error
    assert eager_hpu.is_out_of_memory(error.value)
    assert eager_hpu.is_out_of_memory(RuntimeError(DEVMEM_OOM))
    assert not eager_hpu.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not eager_hpu.is_out_of_memory(RuntimeError("HPU out of memory")), "a wording no bridge uses"


def test_without_an_hpu_only_lightnings_cases(no_hpu: None) -> None:
    assert not tuner_oom.is_hpu_out_of_memory(RuntimeError(DEVMEM_OOM))
    assert scaling.is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))


def test_unsupported_lightning_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(scaling, "is_oom_error", memory.is_oom_error)
    with pytest.warns(UserWarning, match="batch-size search"):
        assert tuner_oom.install() is False
    assert scaling.is_oom_error is memory.is_oom_error
    assert not tuner_oom.installed()
