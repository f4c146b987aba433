"""The LR-scheduler patch (``lightning_gaudi/patches/lr_scheduler.py``): rebinding a scheduler to a new optimizer.

The canaries fail when torch's ``LRScheduler`` stops marking its optimizer's ``step`` with ``_wrapped_by_lr_sched``
and ``_opt_called``, or stops warning when it is stepped before the optimizer.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning_utilities.core.imports import RequirementCache
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FusedOptimizers
from lightning_gaudi.patches import lr_scheduler, registry

UPSTREAM = "torch.optim.lr_scheduler.LRScheduler"
BEFORE_OPTIMIZER = r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"
OVERRIDDEN = r"`optimizer.step\(\)` has been overridden after learning rate scheduler initialization"


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def _step(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()


@pytest.fixture
def model() -> nn.Linear:
    return nn.Linear(2, 1)


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_installed_after_import() -> None:
    assert lr_scheduler.installed()
    assert lr_scheduler.PATCH.installed()
    assert RequirementCache(registry.SUPPORTED_TORCH), (
        f"torch {torch.__version__} is outside {registry.SUPPORTED_TORCH}: re-check patches/lr_scheduler.py against"
        " it (the canaries below), then widen the range."
    )


def test_torch_marks_the_optimizer_step(model: nn.Module) -> None:
    """Canary: what torch's scheduler does to its optimizer, which the patch imitates."""
    optimizer = _optimizer(model)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    assert getattr(optimizer.step, lr_scheduler.STEP_WRAPPED_FLAG, False), (
        f"{UPSTREAM}.__init__ no longer marks optimizer.step with `{lr_scheduler.STEP_WRAPPED_FLAG}`"
    )
    assert not getattr(optimizer, lr_scheduler.STEP_CALLED_FLAG, False)
    _step(optimizer, model)
    assert getattr(optimizer, lr_scheduler.STEP_CALLED_FLAG, False), (
        f"{UPSTREAM}'s wrapped optimizer.step no longer sets `optimizer.{lr_scheduler.STEP_CALLED_FLAG}`"
    )


def test_torch_still_warns_when_the_scheduler_steps_first(model: nn.Module) -> None:
    """Canary: the check the patch keeps working."""
    scheduler = torch.optim.lr_scheduler.StepLR(_optimizer(model), step_size=1)
    with pytest.warns(UserWarning, match=BEFORE_OPTIMIZER):
        scheduler.step()


def test_plain_rebinding_warns_falsely(model: nn.Module) -> None:
    """What the patch fixes: a scheduler moved to an optimizer torch did not mark."""
    scheduler = torch.optim.lr_scheduler.StepLR(_optimizer(model), step_size=1)
    new = _optimizer(model)
    scheduler.optimizer = new
    _step(new, model)
    with pytest.warns(UserWarning, match=OVERRIDDEN):
        scheduler.step()


def test_rebound_scheduler_does_not_warn_falsely(model: nn.Linear, no_warnings: None) -> None:
    old = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(old, step_size=1, gamma=0.5)
    new = _optimizer(model)
    lr_scheduler.rebind_scheduler(scheduler, old, new)
    assert scheduler.optimizer is new
    weight = model.weight.detach().clone()
    _step(new, model)
    scheduler.step()  # raises if torch warns (no_warnings)
    assert not torch.equal(model.weight, weight)  # the new optimizer's step still runs
    assert new.param_groups[0]["lr"] == pytest.approx(0.05)  # and the scheduler drives it


def test_rebound_scheduler_keeps_the_check(model: nn.Module) -> None:
    old = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(old, step_size=1)
    new = _optimizer(model)
    lr_scheduler.rebind_scheduler(scheduler, old, new)
    with pytest.warns(UserWarning, match=BEFORE_OPTIMIZER):
        scheduler.step()


def test_fused_optimizers_rebind_without_warnings(eager_hpu: hpu.Backend) -> None:
    class Scheduled(Workload):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}

    trainer = quiet_trainer(max_steps=2, callbacks=[FusedOptimizers()])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler.*|.*optimizer.step.*")
        trainer.fit(Scheduled(), loader(2))
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is trainer.optimizers[0]


def test_torch_outside_the_checked_range(monkeypatch: pytest.MonkeyPatch, model: nn.Module) -> None:
    monkeypatch.setattr(registry, "TORCH_SUPPORTED", RequirementCache("torch<1.0"))
    monkeypatch.setattr(lr_scheduler._State, "enabled", False)
    with pytest.warns(UserWarning, match="still moves LR schedulers"):
        assert lr_scheduler.install() is False
    old = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(old, step_size=1)
    new = _optimizer(model)
    step = new.step
    lr_scheduler.rebind_scheduler(scheduler, old, new)
    assert scheduler.optimizer is new
    assert new.step == step  # nothing of torch's private flags touched
