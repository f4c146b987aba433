"""FP8 on the real-bridge path: Intel's Transformer Engine, through the seam, on the bridge double."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.workload import quiet_trainer
from lightning.fabric import Fabric
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.fp8 import FP8Recipe, HPUFP8Precision
from lightning_gaudi.hpu.bridge import HabanaBackend

from .test_precision import Regression

TE = "habana_frameworks.torch.hpex.experimental.transformer_engine"


@pytest.fixture
def host_tensor_bridge(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bridge path in eager mode with tensors on the host (the double cannot hold tensors on an "hpu" device)."""
    monkeypatch.setattr(HabanaBackend, "device_type", "cpu")
    bridge_double.configure(lazy=False)
    return bridge_double


def test_trainer_fp8_drives_intels_transformer_engine(host_tensor_bridge: ModuleType) -> None:
    model = Regression()
    weights = [layer.weight for layer in model.net if isinstance(layer, nn.Linear)]
    plugin = HPUFP8Precision(recipe=FP8Recipe(format="hybrid", amax_history_len=16, margin=1))
    trainer = quiet_trainer(plugins=[plugin], max_steps=3)
    trainer.fit(model)
    state = host_tensor_bridge
    (scaling,) = state.called("te.recipe.DelayedScaling")  # made once, not every step
    recipe_module = __import__(f"{TE}.recipe", fromlist=["Format"])
    assert scaling.kwargs == {
        "margin": 1,
        "interval": 1,
        "fp8_format": recipe_module.Format.HYBRID,
        "amax_history_len": 16,
        "amax_compute_algo": "max",
    }
    linears = state.called("te.Linear")
    assert [call.args for call in linears] == [(16, 64), (64, 64), (64, 16)]
    assert all(c.kwargs["skip_weight_param_allocation"] and c.kwargs["params_dtype"] == torch.float32 for c in linears)
    te_layers = [layer for layer in model.net if type(layer).__module__ == TE]
    assert [layer.weight for layer in te_layers] == weights  # the same Parameters
    autocasts = state.called("te.fp8_autocast")
    assert len(autocasts) == 3
    assert all(c.kwargs["enabled"] for c in autocasts)
    recipe = autocasts[0].kwargs["fp8_recipe"]
    assert all(c.kwargs["fp8_recipe"] is recipe for c in autocasts)
    forwards = state.called("te.Linear.forward")
    assert len(forwards) == 9
    assert all(c.kwargs["fp8_enabled"] and c.kwargs["recipe"] is recipe for c in forwards)


def test_checkpoints_keep_nn_linear_keys_and_transformer_engines_metadata(
    host_tensor_bridge: ModuleType, tmp_path: Path
) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    model = Regression()
    trainer = quiet_trainer(precision="fp8", max_steps=2, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(model)
    assert model.net[0].get_extra_state() == {"fp8_forwards": 2}  # TE's metadata (`_extra_state` in its state dict)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert list(saved["state_dict"]) == list(Regression().state_dict())  # without it in the model's state
    assert saved["HPUFP8Precision"]["net.2"] == {"fp8_forwards": 2}  # but beside it
    Regression().load_state_dict(saved["state_dict"])  # strict, without FP8
    model.load_state_dict(Regression().state_dict())  # and a plain state dict into the converted model
    assert model.net[0].fp8_forwards == 2  # leaves its FP8 metadata
    resumed = Regression()
    host_tensor_bridge.reset()
    quiet_trainer(precision="fp8", max_steps=3, max_epochs=2).fit(resumed, ckpt_path=tmp_path / "last.ckpt")
    assert host_tensor_bridge.called("te.Linear.set_extra_state")[0].args == ({"fp8_forwards": 2},)
    assert resumed.net[0].fp8_forwards == 3


def test_fabric_fp8_drives_intels_transformer_engine(host_tensor_bridge: ModuleType) -> None:
    fabric = Fabric(accelerator="hpu", devices=1, precision="fp8")
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    model = fabric.setup(module)
    model(torch.randn(2, 16))
    assert type(module[0]).__module__ == TE
    assert type(module[2]) is nn.Linear
    (forward,) = host_tensor_bridge.called("te.Linear.forward")
    assert forward.kwargs["fp8_enabled"]


def test_first_generation_gaudi_is_refused(bridge_double: ModuleType) -> None:
    bridge_double.configure(device_name="GAUDI")
    with pytest.raises(ValueError, match=r"first-generation Gaudi \(GAUDI\)"):
        HPUFP8Precision()
    assert not hpu.get_backend().supports_fp8()
    assert not bridge_double.called("te.recipe.DelayedScaling")


#: Intel's FP8 API as the double imitates it (Intel's documentation and optimum-habana's calls; NVIDIA's Transformer
#: Engine 1.x for the defaults Intel does not document).
SIGNATURES = {
    "Linear": "(in_features, out_features, bias=True, params_dtype=None, skip_weight_param_allocation=False, **kwargs)",
    "fp8_autocast": "(enabled=False, calibrating=False, fp8_recipe=None, fp8_group=None)",
    "recipe.DelayedScaling": (
        "(margin=0, interval=1, fp8_format=<Format.HYBRID: 'HYBRID'>, amax_history_len=1024,"
        " amax_compute_algo='max', scaling_factor_compute_algo=None, override_linear_precision=(False, False, False))"
    ),
}


@pytest.mark.parametrize("qualified", sorted(SIGNATURES))
def test_double_has_the_documented_signatures(bridge_double: ModuleType, qualified: str) -> None:
    import importlib

    module_name, _, name = f"{TE}.{qualified}".rpartition(".")
    assert str(inspect.signature(getattr(importlib.import_module(module_name), name))) == SIGNATURES[qualified]
