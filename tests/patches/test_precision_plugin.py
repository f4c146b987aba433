"""The precision-plugin patch (``lightning_gaudi/patches/precision_plugin.py``): a method overridden on one plugin.

The canaries fail when Lightning changes ``Precision.clip_grad_by_norm(optimizer, clip_val)``,
``MixedPrecision.autocast_context_manager()`` or the paths that call them through the plugin instance.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning_utilities.core.imports import RequirementCache
from torch.optim import Optimizer

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FusedOptimizers
from lightning_gaudi.patches import precision_plugin, registry
from lightning_gaudi.patches.precision_plugin import override_method

CLIP_PATH = (
    "Precision._clip_gradients -> LightningModule.configure_gradient_clipping -> LightningModule.clip_gradients"
    " -> Precision.clip_gradients -> self.clip_grad_by_norm(optimizer, clip_val)"
)


class _RecordClipping(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[Optimizer, float]] = []
        self.override: precision_plugin.Override | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        def record(optimizer: Optimizer, clip_val: int | float) -> None:
            self.calls.append((optimizer, clip_val))

        self.override = override_method(trainer.precision_plugin, "clip_grad_by_norm", record)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        assert self.override is not None
        self.override.restore()


def test_installed_after_import() -> None:
    assert precision_plugin.installed()
    assert precision_plugin.PATCH.installed()


def test_methods_have_the_parameters_relied_on() -> None:
    """Canary: the overridden methods' signatures."""
    assert precision_plugin.missing_targets() == [], "Lightning changed the precision plugin methods overridden"
    assert list(inspect.signature(Precision.clip_grad_by_norm).parameters) == ["self", "optimizer", "clip_val"], (
        "Lightning's lightning.pytorch.plugins.precision.Precision.clip_grad_by_norm changed its parameters"
    )
    assert list(inspect.signature(MixedPrecision.autocast_context_manager).parameters) == ["self"], (
        "Lightning's lightning.pytorch.plugins.precision.MixedPrecision.autocast_context_manager changed its parameters"
    )


def test_lightning_clips_through_the_instance_method() -> None:
    """Canary: a fit with ``gradient_clip_val`` reaches the overridden ``clip_grad_by_norm``."""
    recorder = _RecordClipping()
    trainer = Trainer(
        accelerator="cpu",
        max_steps=2,
        gradient_clip_val=0.5,
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(Workload(), loader(2))
    assert [value for _, value in recorder.calls] == [0.5, 0.5], f"Lightning no longer calls {CLIP_PATH}"
    assert all(optimizer is trainer.optimizers[0] for optimizer, _ in recorder.calls)
    assert "clip_grad_by_norm" not in vars(trainer.precision_plugin)


def test_mixed_precision_enters_autocast_through_the_instance_method() -> None:
    """Canary: ``MixedPrecision.forward_context`` (and the step contexts) call ``self.autocast_context_manager()``."""
    plugin = MixedPrecision("bf16-mixed", device="cpu")
    entered: list[str] = []

    @contextlib.contextmanager
    def recording() -> Iterator[None]:
        entered.append("autocast")
        yield

    handle = override_method(plugin, "autocast_context_manager", recording)
    for context in (plugin.forward_context, plugin.train_step_context, plugin.val_step_context):
        with context():
            pass
    handle.restore()
    assert entered == ["autocast"] * 3, (
        "Lightning's MixedPrecision.forward_context / *_step_context no longer call self.autocast_context_manager()"
    )
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu")  # the class's method again


def test_restore() -> None:
    plugin = Precision()

    def replacement(optimizer: Optimizer, clip_val: int | float) -> None:
        pass

    handle = override_method(plugin, "clip_grad_by_norm", replacement)
    assert plugin.clip_grad_by_norm is replacement
    assert handle.active
    handle.restore()
    handle.restore()  # twice is harmless
    assert not handle.active
    assert "clip_grad_by_norm" not in vars(plugin)
    first = override_method(plugin, "clip_grad_by_norm", replacement)
    second = override_method(plugin, "clip_grad_by_norm", lambda optimizer, clip_val: None)
    second.restore()
    assert plugin.clip_grad_by_norm is replacement  # back to what was there before
    first.restore()
    assert "clip_grad_by_norm" not in vars(plugin)


class _ChangedPlugin(Precision):
    def clip_grad_by_norm(self, optimizer: Optimizer, max_norm: float, norm_type: float = 2.0) -> None:  # type: ignore[override]
        pass


@pytest.mark.parametrize(
    ("plugin", "name", "function", "error", "match"),
    [
        (Precision(), "clip_grad_by_value", lambda optimizer, clip_val: None, ValueError, "cannot override"),
        (Precision(), "autocast_context_manager", contextlib.nullcontext, TypeError, "needs a Lightning"),
        (Precision(), "clip_grad_by_norm", lambda optimizer: None, ValueError, "must take"),
        (_ChangedPlugin(), "clip_grad_by_norm", lambda optimizer, clip_val: None, TypeError, "does not take"),
    ],
)
def test_guards(plugin: Any, name: str, function: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        override_method(plugin, name, function)
    assert name not in vars(plugin)


def test_lightning_outside_the_checked_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(precision_plugin._State, "enabled", False)
    with pytest.warns(UserWarning, match="leave gradient clipping to Lightning"):
        assert precision_plugin.install() is False
    with pytest.raises(RuntimeError, match=r"only on lightning>=2\.5,<2\.7"):
        override_method(Precision(), "clip_grad_by_norm", lambda optimizer, clip_val: None)


def test_changed_lightning_method_is_not_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(self: Precision, optimizer: Optimizer, max_norm: float) -> None:
        pass

    monkeypatch.setattr(Precision, "clip_grad_by_norm", changed)
    monkeypatch.setattr(precision_plugin._State, "enabled", False)
    with pytest.warns(UserWarning, match=r"Precision.clip_grad_by_norm\(self, optimizer, clip_val\)"):
        assert precision_plugin.install() is False


def test_fused_optimizers_clip_with_the_fused_clipper_and_restore(eager_hpu: hpu.Backend) -> None:
    seen: list[bool] = []

    class Probe(Callback):
        def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
            seen.append("clip_grad_by_norm" in vars(trainer.precision_plugin))

    trainer = quiet_trainer(max_steps=2, gradient_clip_val=1.0, callbacks=[FusedOptimizers(), Probe()])
    trainer.fit(Workload("adamw"), loader(2))
    assert seen == [True, True]
    assert "clip_grad_by_norm" not in vars(trainer.precision_plugin)  # restored at teardown


def test_fused_optimizers_leave_clipping_to_lightning_when_not_installed(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision_plugin._State, "enabled", False)
    trainer = quiet_trainer(max_steps=1, gradient_clip_val=1.0, callbacks=[FusedOptimizers()])
    with pytest.warns(UserWarning, match="leaves gradient clipping to Lightning"):
        trainer.fit(Workload("adamw"), loader(1))
