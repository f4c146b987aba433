"""The logging_cadence patch (``lightning_gaudi/patches/logging_cadence.py``): when Lightning writes training rows.

The canaries fail when Lightning changes when, or at which step, it writes a training batch's logged metrics.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi.patches import logging_cadence, registry


class _Steps(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "loss" in metrics:
            assert step is not None
            self.steps.append(step)


class _Predict(Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        step = logging_cadence.train_log_step(trainer)
        if step is not None:
            self.steps.append(step)


class _Logs(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch: tuple[Tensor], batch_idx: int) -> Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_installed_after_import() -> None:
    assert logging_cadence.installed()
    assert logging_cadence.PATCH.installed()


def test_lightning_still_decides_as_read() -> None:
    """Canary: the Lightning code that decides when and at which step training rows are written."""
    assert logging_cadence.missing_targets() == [], "Lightning logs training steps otherwise: re-check the patch"


@pytest.mark.parametrize(
    "settings",
    [
        {"log_every_n_steps": 3},
        {"log_every_n_steps": 2, "accumulate_grad_batches": 3},
        {"log_every_n_steps": 4, "max_steps": 5},
    ],
)
def test_predicts_the_steps_lightning_writes(settings: dict[str, Any]) -> None:
    """Canary: what train_log_step says in on_train_batch_end is what Lightning then writes."""
    steps, predict = _Steps(), _Predict()
    trainer = Trainer(
        accelerator="cpu",
        logger=steps,
        callbacks=[predict],
        max_epochs=2,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **settings,
    )
    data = DataLoader(TensorDataset(torch.randn(11, 2)), batch_size=1)
    trainer.fit(_Logs(), data)
    assert steps.steps, "Lightning wrote no training rows: the settings test nothing"
    assert predict.steps == steps.steps


def test_unsupported_lightning_warns_and_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(logging_cadence._State, "enabled", False)
    with pytest.warns(UserWarning, match="MemoryStats will log every n optimizer steps"):
        assert logging_cadence.install() is False
    with pytest.raises(RuntimeError, match="only on lightning"):
        logging_cadence.train_log_step(object())
