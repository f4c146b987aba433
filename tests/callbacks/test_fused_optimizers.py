"""fuse_optimizer and HPUPrecision's fused clipping: same numerics as torch's optimizers, schedulers built on the fused
optimizer, state restored, bad input refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from torch import nn

from lightning_gaudi import HPUPrecision, fuse_optimizer, hpu


class Fusable(Workload):
    """The workload's torch optimizer, through ``fuse_optimizer`` when ``fused``."""

    fused = False

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        return fuse_optimizer(optimizer) if self.fused else optimizer


class Scheduled(Fusable):
    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _fit(model: Fusable, fused: bool, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    model.fused = fused
    trainer = quiet_trainer(max_steps=4, **kwargs)
    trainer.fit(model, loader(4))
    return trainer


def _counting_clippers(backend: hpu.Backend, clips: list[float]) -> None:
    make_clipper = backend.fused_clip_norm

    def counting_clipper(parameters: Any, max_norm: float) -> hpu.ClipNorm:
        clips.append(max_norm)
        return make_clipper(parameters, max_norm)

    backend.fused_clip_norm = counting_clipper  # type: ignore[method-assign]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_eager_fused_matches_unfused_with_a_scheduler(eager_hpu: hpu.Backend, optimizer: str, precision: str) -> None:
    """Same parameters as torch's optimizer with a scheduler and clipping; under HPUPrecision the fused clipper."""
    extra = {"momentum": 0.9, "nesterov": True} if optimizer == "sgd" else {"eps": 1e-8, "weight_decay": 0.01}
    torch.manual_seed(0)
    reference = Scheduled(optimizer, **extra)
    candidate = Scheduled(optimizer, **extra)
    candidate.load_state_dict(reference.state_dict())
    _fit(reference, fused=False, gradient_clip_val=0.5, precision=precision)

    clips: list[float] = []
    _counting_clippers(eager_hpu, clips)
    try:
        trainer = _fit(candidate, fused=True, gradient_clip_val=0.5, precision=precision)
    finally:
        del eager_hpu.fused_clip_norm
    fused = trainer.optimizers[0]
    assert fused.defaults["fused"] is True
    assert fused is not reference.trainer.optimizers[0]
    mixed = precision == "bf16-mixed"
    assert clips == ([0.5] if mixed else []), "HPUPrecision: one fused clipper, built once and reused every step"
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is fused
    assert fused.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**4)
    if optimizer == "adamw":
        assert fused.param_groups[0]["eps"] == 1e-8
    for expected, actual in zip(reference.parameters(), candidate.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_clip_norm_false_leaves_clipping_to_lightning(eager_hpu: hpu.Backend) -> None:
    clips: list[float] = []
    _counting_clippers(eager_hpu, clips)
    try:
        optimizer = fuse_optimizer(torch.optim.AdamW(nn.Linear(2, 2).parameters()), clip_norm=False)
        HPUPrecision("bf16-mixed").clip_gradients(optimizer, 0.5)
        assert clips == []
        HPUPrecision("bf16-mixed").clip_gradients(fuse_optimizer(torch.optim.AdamW(nn.Linear(2, 2).parameters())), 0.5)
        assert clips == [0.5]
    finally:
        del eager_hpu.fused_clip_norm


def test_eager_resume_restores_fused_state(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    trainer = _fit(Fusable("adamw"), fused=True)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = trainer.optimizers[0].state_dict()
    restored: dict[str, Any] = {}

    class Peek(Fusable):
        fused = True

        def on_train_start(self) -> None:
            restored.update(copy.deepcopy(self.trainer.optimizers[0].state_dict()))

    resumed = quiet_trainer(max_steps=6, max_epochs=2)
    resumed.fit(Peek("adamw"), loader(4), ckpt_path=path)
    assert resumed.optimizers[0].defaults["fused"] is True
    torch.testing.assert_close(restored["state"], saved["state"])


def test_lazy_emulation_uses_single_tensor_kernels(lazy_hpu: hpu.Backend) -> None:
    with pytest.warns(UserWarning, match="no fused optimizer kernels"):
        trainer = _fit(Scheduled("adamw"), fused=True, gradient_clip_val=0.5)
    assert trainer.optimizers[0].defaults["foreach"] is False
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is trainer.optimizers[0]


def test_bridge_uses_hpex_keeps_eps_drops_empty_groups_and_clips_fused(bridge_double: ModuleType) -> None:
    net = nn.Linear(2, 2)
    groups = [{"params": [net.weight]}, {"params": [], "lr": 0.5}, {"params": [net.bias], "weight_decay": 0.0}]
    fused = fuse_optimizer(torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1))
    (call,) = bridge_double.called("hpex.FusedAdamW")
    assert call.kwargs["eps"] == 1e-8, "torch's eps, not FusedAdamW's 1e-6"
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    assert [g["params"] for g in fused.param_groups] == [[net.weight], [net.bias]]

    fuse_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True))
    (call,) = bridge_double.called("hpex.FusedSGD")
    assert call.kwargs == {"lr": 0.1, "momentum": 0.9, "weight_decay": 0, "dampening": 0, "nesterov": True}

    net.weight.grad = torch.full_like(net.weight, 10.0)
    net.bias.grad = torch.zeros_like(net.bias)
    HPUPrecision("bf16-mixed").clip_gradients(fused, 1.0)  # what Trainer(gradient_clip_val=1.0) calls
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


class ClipProbe(Fusable):
    """AdamW regression that records the gradients' total norm right after clipping, and can poison one step's
    gradients with inf (which the fp16 gradient scaler must catch: that step is skipped)."""

    def __init__(self, poison_step: int | None = None) -> None:
        super().__init__("adamw", eps=1e-8)
        self.poison_step = poison_step
        self.clipped_norms: list[float] = []

    def on_after_backward(self) -> None:
        if self.trainer.global_step == self.poison_step:
            self.net[0].weight.grad[0, 0] = float("inf")

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        norms = [p.grad.float().norm() for p in self.parameters() if p.grad is not None]
        self.clipped_norms.append(torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0)


def _fp16_clip_run(fused: bool, poison_step: int | None = None) -> tuple[ClipProbe, Any]:
    model = ClipProbe(poison_step)
    # a small initial scale, so that only the poisoned step overflows
    plugin = HPUPrecision("16-mixed", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    trainer = _fit(model, fused=fused, gradient_clip_val=0.05, plugins=[plugin])
    return model, trainer


@pytest.mark.parametrize("poison_step", [None, 1])
def test_16_mixed_clips_a_fused_optimizer_like_an_unfused_one(eager_hpu: hpu.Backend, poison_step: int | None) -> None:
    """fp16 + fused + clipping: gradients are unscaled before they are clipped, and inf steps are still skipped."""
    torch.manual_seed(0)
    reference, reference_trainer = _fp16_clip_run(fused=False, poison_step=poison_step)
    torch.manual_seed(0)
    candidate, trainer = _fp16_clip_run(fused=True, poison_step=poison_step)
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(candidate.clipped_norms) == 4
    skipped = [] if poison_step is None else [poison_step]
    assert [i for i, n in enumerate(reference.clipped_norms) if not math.isfinite(n)] == skipped
    finite = [n for n in reference.clipped_norms if math.isfinite(n)]
    assert all(n == pytest.approx(0.05, rel=1e-3) for n in finite), "clipped to the bound, in unscaled units"
    torch.testing.assert_close(
        torch.tensor(candidate.clipped_norms), torch.tensor(reference.clipped_norms), equal_nan=True
    )
    scale, reference_scale = (t.precision_plugin.scaler.get_scale() for t in (trainer, reference_trainer))
    assert scale == reference_scale == (2.0**7 if poison_step is not None else 2.0**8)
    for expected, actual in zip(reference.parameters(), candidate.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_16_mixed_string_skips_the_overflowing_first_step_of_a_fused_optimizer(eager_hpu: hpu.Backend) -> None:
    """The default scale (2**16) overflows this model's first gradients: the fused step must be skipped."""
    torch.manual_seed(0)
    model = ClipProbe()
    model.fused = True
    before = [p.detach().clone() for p in model.parameters()]
    trainer = quiet_trainer(max_steps=1, gradient_clip_val=0.05, precision="16-mixed")
    trainer.fit(model, loader(1))
    assert trainer.optimizers[0].defaults["fused"] is True
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**15, "the inf step lowered the scale"
    for old, new in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(new, old, rtol=0, atol=0)


class ClipTwice(ClipProbe):
    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


class SkipsABatch(ClipProbe):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx == 1 else loss  # Lightning skips backward and the step


@pytest.mark.parametrize("model_class", [ClipTwice, SkipsABatch])
def test_16_mixed_fused_clipping_unscales_once_per_step(eager_hpu: hpu.Backend, model_class: type) -> None:
    """Clipping twice in a step, or a batch whose backward is skipped, must not unscale twice before one update."""
    torch.manual_seed(0)
    model = model_class()
    plugin = HPUPrecision("16-mixed", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    trainer = _fit(model, fused=True, gradient_clip_val=0.05, plugins=[plugin])
    assert trainer.global_step == 4
    assert all(n == pytest.approx(0.05, rel=1e-3) for n in model.clipped_norms if n > 0.0)
