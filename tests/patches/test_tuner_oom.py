"""The tuner_oom patch (``lightning_gaudi/patches/tuner_oom.py``): Lightning's batch-size finder backs off on HPU OOM.

The canaries fail when Lightning's batch-size scaling stops reading the ``is_oom_error`` the patch replaces.
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


class GraphPerSample(Workload):
    """A model whose ops need 1 MiB of device memory per sample (told to the bridge double)."""

    def __init__(self, state: ModuleType, batch_size: int = 2, error: Exception | None = None) -> None:
        super().__init__()
        self.state = state
        self.batch_size = batch_size
        self.error = error

    def train_dataloader(self) -> Any:
        return loader(2, batch_size=self.batch_size)

    def val_dataloader(self) -> Any:
        return loader(1)  # the tuner asks for it; validation is off (limit_val_batches=0)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.error is not None and self.batch_size > 2:
            raise self.error
        self.state.run_ops(len(batch[0]) * MIB)
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


def test_batch_size_search_backs_off_on_hpu_oom(host_tensor_bridge: ModuleType, tmp_path: Path) -> None:
    """2, 4 and 8 samples fit in 8 MiB; 16 run out of memory, and the search settles on 8."""
    model = GraphPerSample(host_tensor_bridge)
    trainer = quiet_trainer(default_root_dir=tmp_path)
    assert isinstance(hpu.get_backend(), HabanaBackend)
    size = Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=1, init_val=2, max_trials=8)
    assert size == model.batch_size == 8


def test_other_errors_still_stop_the_search(host_tensor_bridge: ModuleType, tmp_path: Path) -> None:
    model = GraphPerSample(host_tensor_bridge, error=RuntimeError("shape mismatch"))
    trainer = quiet_trainer(default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=1, init_val=2, max_trials=8)


def test_emulation_recognises_the_hosts_out_of_memory(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(RuntimeError) as error:
        torch.empty(2**62, dtype=torch.uint8)  # the host's allocator refuses: a real out-of-memory error
    assert eager_hpu.is_out_of_memory(error.value)
    assert not eager_hpu.is_out_of_memory(RuntimeError("shape mismatch"))


def test_without_an_hpu_only_lightnings_cases(no_hpu: None) -> None:
    assert not tuner_oom.is_hpu_out_of_memory(RuntimeError("HPU out of memory"))
    assert scaling.is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))


def test_unsupported_lightning_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(scaling, "is_oom_error", memory.is_oom_error)
    with pytest.warns(UserWarning, match="batch-size search"):
        assert tuner_oom.install() is False
    assert scaling.is_oom_error is memory.is_oom_error
    assert not tuner_oom.installed()
