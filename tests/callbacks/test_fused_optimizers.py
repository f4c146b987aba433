"""FusedOptimizers: same numerics as torch's optimizers, scheduler kept bound, state restored, bad input refused."""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FusedOptimizers
from lightning_gaudi.callbacks.fused_optimizers import fuse_optimizer


class Scheduled(Workload):
    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _fit(model: Workload, fused: bool, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    callbacks = [FusedOptimizers()] if fused else []
    trainer = quiet_trainer(max_steps=4, callbacks=callbacks, **kwargs)
    trainer.fit(model, loader(4))
    return trainer


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_eager_fused_matches_unfused_and_keeps_scheduler_bound(eager_hpu: hpu.Backend, optimizer: str) -> None:
    extra = {"momentum": 0.9, "nesterov": True} if optimizer == "sgd" else {"eps": 1e-8, "weight_decay": 0.01}
    torch.manual_seed(0)
    reference = Scheduled(optimizer, **extra)
    candidate = Scheduled(optimizer, **extra)
    candidate.load_state_dict(reference.state_dict())
    _fit(reference, fused=False, gradient_clip_val=0.5)

    clips: list[float] = []
    make_clipper = eager_hpu.fused_clip_norm

    def counting_clipper(parameters: Any, max_norm: float) -> hpu.ClipNorm:
        clips.append(max_norm)
        return make_clipper(parameters, max_norm)

    eager_hpu.fused_clip_norm = counting_clipper  # type: ignore[method-assign]
    try:
        trainer = _fit(candidate, fused=True, gradient_clip_val=0.5)
    finally:
        del eager_hpu.fused_clip_norm
    fused = trainer.optimizers[0]
    assert fused.defaults["fused"] is True
    assert fused is not reference.trainer.optimizers[0]
    assert clips == [0.5], "one fused clipper, built once and reused every step"
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.optimizer is fused
    assert fused.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**4)
    if optimizer == "adamw":
        assert fused.param_groups[0]["eps"] == 1e-8
    for expected, actual in zip(reference.parameters(), candidate.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_bf16_mixed_clips_a_fused_optimizer(eager_hpu: hpu.Backend) -> None:
    """bf16 autocast has no gradient scaler, so a fused optimizer may be clipped (Lightning's AMP plugin refuses)."""
    trainer = _fit(Scheduled("adamw"), fused=True, gradient_clip_val=0.5, precision="bf16-mixed")
    assert trainer.optimizers[0].defaults["fused"] is True
    assert trainer.global_step == 4


def test_eager_resume_restores_fused_state(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    model = Workload("adamw")
    trainer = _fit(model, fused=True)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = trainer.optimizers[0].state_dict()

    resumed = quiet_trainer(max_steps=6, max_epochs=2, callbacks=[FusedOptimizers()])
    restored: dict[str, Any] = {}

    class Peek(Workload):
        def on_train_start(self) -> None:
            restored.update(copy.deepcopy(self.trainer.optimizers[0].state_dict()))

    resumed.fit(Peek("adamw"), loader(4), ckpt_path=path)
    assert resumed.optimizers[0].defaults["fused"] is True
    torch.testing.assert_close(restored["state"], saved["state"])


def test_lazy_emulation_swaps_to_single_tensor_kernels(lazy_hpu: hpu.Backend) -> None:
    with pytest.warns(UserWarning, match="no fused optimizer kernels"):
        trainer = _fit(Scheduled("adamw"), fused=True, gradient_clip_val=0.5)
    assert trainer.optimizers[0].defaults["foreach"] is False
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is trainer.optimizers[0]


def test_bridge_uses_hpex_keeps_eps_and_drops_empty_groups(bridge_double: ModuleType) -> None:
    net = nn.Linear(2, 2)
    groups = [{"params": [net.weight]}, {"params": [], "lr": 0.5}, {"params": [net.bias], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1)
    fused = fuse_optimizer(optimizer)
    (call,) = bridge_double.called("hpex.FusedAdamW")
    assert call.kwargs["eps"] == 1e-8, "torch's eps, not FusedAdamW's 1e-6"
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    assert [g["params"] for g in fused.param_groups] == [[net.weight], [net.bias]]

    fuse_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True))
    (call,) = bridge_double.called("hpex.FusedSGD")
    assert call.kwargs == {"lr": 0.1, "momentum": 0.9, "weight_decay": 0, "dampening": 0, "nesterov": True}

    clipper = hpu.get_backend().fused_clip_norm(list(net.parameters()), 1.0)
    net.weight.grad = torch.full_like(net.weight, 10.0)
    net.bias.grad = torch.zeros_like(net.bias)
    clipper.clip_norm(list(net.parameters()))
    assert bridge_double.called("hpex.FusedClipNorm.clip_norm")
    assert net.weight.grad.norm().item() == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize(
    ("optimizer", "match"),
    [
        (lambda p: torch.optim.RMSprop(p), "cannot replace RMSprop"),
        (lambda p: torch.optim.AdamW(p, amsgrad=True), "amsgrad=True"),
        (lambda p: torch.optim.Adam(p, weight_decay=0.1), "L2 penalty"),
        (lambda p: torch.optim.SGD(p, lr=0.1, maximize=True), "maximize=True"),
    ],
)
def test_cannot_replace(eager_hpu: hpu.Backend, optimizer: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fuse_optimizer(optimizer(nn.Linear(2, 2).parameters()))


def test_bad_configuration(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="cannot replace 'RMSprop'"):
        FusedOptimizers(optimizers=["AdamW", "RMSprop"])


def test_other_optimizers_left_alone(eager_hpu: hpu.Backend) -> None:
    class Rms(Workload):
        def configure_optimizers(self) -> Any:
            return torch.optim.RMSprop(self.parameters(), lr=0.01)

    with pytest.warns(UserWarning, match="leaves RMSprop as it is"):
        trainer = _fit(Rms(), fused=True)
    assert isinstance(trainer.optimizers[0], torch.optim.RMSprop)
