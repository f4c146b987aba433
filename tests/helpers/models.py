"""A small, deterministic regression model and data set for training tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

IN_FEATURES = 4


def regression_data(samples: int = 32, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Inputs and targets of a fixed linear problem with a little noise, the same on every call."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, IN_FEATURES, generator=generator)
    weight = torch.arange(1.0, IN_FEATURES + 1).unsqueeze(1)
    y = x @ weight + 0.1 * torch.randn(samples, 1, generator=generator)
    return x, y


def regression_loader(samples: int = 32, batch_size: int = 4) -> DataLoader:
    """A loader over :func:`regression_data` in order (for DDP, Lightning's DistributedSampler reshuffles it)."""
    return DataLoader(TensorDataset(*regression_data(samples)), batch_size=batch_size, shuffle=False)


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


class RegressionModel(LightningModule):
    """Mean-squared-error regression with plain SGD.

    Attributes:
        seen: what :meth:`training_step` observed on its first call (parameter device and dtype, autocast state,
            the dtype of the first layer's output).
    """

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.net = make_net()
        self.seen: dict[str, Any] = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        hidden = self.net[0](x)
        if not self.seen:
            param = next(self.parameters())
            self.seen = {
                "param_device": param.device.type,
                "param_dtype": param.dtype,
                "input_device": x.device.type,
                "autocast_cpu": torch.is_autocast_enabled("cpu"),
                "autocast_dtype": torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None,
                "hidden_dtype": hidden.dtype,
            }
        out = self.net[2](self.net[1](hidden))
        return nn.functional.mse_loss(out.float(), y.float())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        return regression_loader()


def trainer_kwargs(**overrides: Any) -> dict[str, Any]:
    """Quiet, short Trainer settings for tests (no logger, checkpoints, progress bar or summary)."""
    kwargs: dict[str, Any] = {
        "max_steps": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    kwargs.update(overrides)
    return kwargs


class Evaluated(RegressionModel):
    """A RegressionModel that validates, tests (its MSE, synchronized over ranks) and predicts."""

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x).float(), y.float())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


def evaluate_after_fit(trainer: Any, model: Evaluated, loader: DataLoader, out: Path) -> None:
    """Runs validate, test and predict on ``trainer`` after its fit; writes both losses and the rows predicted."""
    evaluated = {
        "validate": trainer.validate(model, loader, verbose=False)[0]["val_loss"],
        "test": trainer.test(model, loader, verbose=False)[0]["test_loss"],
        "predicted": sum(len(rows) for rows in trainer.predict(model, loader)),
    }
    out.write_text(json.dumps(evaluated))
