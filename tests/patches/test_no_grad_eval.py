"""No-grad evaluation (``lightning_gaudi/patches/no_grad_eval.py``): ``torch.no_grad`` for one trainer.

The canaries fail when Lightning's evaluation/prediction loops stop taking or reading their ``inference_mode`` flag.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch import Trainer
from lightning.pytorch.loops import utilities
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.prediction_loop import _PredictionLoop
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.patches import no_grad_eval, registry


class GradModeProbe(Workload):
    """Records the autograd mode each evaluation step runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: set[tuple[bool, bool]] = set()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return batch[0]


def _modes(trainer: Trainer) -> set[tuple[bool, bool]]:
    model = GradModeProbe()
    trainer.validate(model, loader(2), verbose=False)
    trainer.predict(model, loader(2))
    return model.modes


def test_installed_after_import() -> None:
    assert no_grad_eval.installed()
    assert no_grad_eval.PATCH.installed()


def test_loops_still_take_and_read_the_flag() -> None:
    """Canary: the loop classes and the context they run under, as the patch relies on."""
    assert no_grad_eval.missing_targets() == [], "Lightning's _EvaluationLoop/_PredictionLoop lost `inference_mode=`"
    for loop in (_EvaluationLoop, _PredictionLoop):
        assert "inference_mode" in inspect.signature(loop.__init__).parameters, (
            f"Lightning's {loop.__qualname__}.__init__ no longer takes `inference_mode`"
        )
    assert "self.inference_mode" in inspect.getsource(utilities._no_grad_context), (
        "Lightning's lightning.pytorch.loops.utilities._no_grad_context no longer reads the loop's"
        " `inference_mode` when it runs: re-check emulation/no_grad_eval.py"
    )
    trainer = Trainer(accelerator="cpu", logger=False)
    assert all(getattr(trainer, name).inference_mode is True for name in no_grad_eval.EVALUATION_LOOPS), (
        f"Lightning's Trainer no longer builds {no_grad_eval.EVALUATION_LOOPS} with an `inference_mode` flag"
    )


def test_stock_loops_run_under_inference_mode() -> None:
    """What the patch changes: Lightning evaluates under torch.inference_mode by default."""
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert _modes(trainer) == {(True, False)}


def test_disable_inference_mode_makes_evaluation_no_grad() -> None:
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    no_grad_eval.disable_inference_mode(trainer)
    assert _modes(trainer) == {(False, False)}, "the loops ignored `inference_mode = False`"


def test_lazy_emulation_evaluates_without_inference_mode(lazy_hpu: hpu.Backend) -> None:
    trainer = quiet_trainer(limit_val_batches=1.0)
    model = GradModeProbe()
    trainer.validate(model, loader(2), verbose=False)
    assert model.modes == {(False, False)}
    assert not trainer.validate_loop.inference_mode


def test_eager_emulation_keeps_inference_mode(eager_hpu: hpu.Backend) -> None:
    trainer = quiet_trainer(limit_val_batches=1.0)
    model = GradModeProbe()
    trainer.validate(model, loader(2), verbose=False)
    assert model.modes == {(True, False)}


def test_missing_flag_is_a_clear_error() -> None:
    trainer = Trainer(accelerator="cpu", logger=False)
    del trainer.test_loop.inference_mode
    with pytest.raises(RuntimeError, match=r"trainer.test_loop.inference_mode.*Trainer\(inference_mode=False\)"):
        no_grad_eval.disable_inference_mode(trainer)


def test_lightning_outside_the_checked_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(no_grad_eval._State, "enabled", False)
    with pytest.warns(UserWarning, match=r"pass `Trainer\(inference_mode=False\)`"):
        assert no_grad_eval.install() is False
    assert not no_grad_eval.installed()
    with pytest.raises(RuntimeError, match=r"Pass `Trainer\(inference_mode=False\)`"):
        no_grad_eval.disable_inference_mode(Trainer(accelerator="cpu", logger=False))
    no_grad_eval.disable_inference_mode(Trainer(accelerator="cpu", logger=False, inference_mode=False))  # nothing to do
