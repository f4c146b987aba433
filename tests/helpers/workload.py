"""A small fixed-shape workload for the callback tests, and a callback that reads the seam's lazy counters."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import hpu

FEATURES = 8


def loader(batches: int, batch_size: int = 4, ragged: int = 0, seed: int = 0) -> DataLoader:
    """``batches`` full batches (plus one of ``ragged`` samples when ``ragged`` > 0), not shuffled."""
    generator = torch.Generator().manual_seed(seed)
    samples = batches * batch_size + ragged
    x = torch.randn(samples, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


class Workload(LightningModule):
    """Regression that logs its loss to the progress bar every step (the loop issue 3 is about).

    The loss is written out (no ``mse_loss``), so Lazy Tensor Core runs it without a CPU fallback.
    """

    def __init__(self, optimizer: str = "sgd", lr: float = 0.05, **optimizer_kwargs: Any) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.optimizer = optimizer
        self.lr = lr
        self.optimizer_kwargs = optimizer_kwargs

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = ((self(x) - y) ** 2).mean()
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", ((self(x) - y) ** 2).mean())

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[self.optimizer]
        return cls(self.parameters(), lr=self.lr, **self.optimizer_kwargs)


def quiet_trainer(**overrides: Any) -> Trainer:
    """An HPU Trainer without logger, checkpoints, summary or validation unless asked for."""
    kwargs: dict[str, Any] = {
        "accelerator": "hpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
    }
    kwargs.update(overrides)
    return Trainer(**kwargs)


class CounterWindow(Callback):
    """Reads the seam's lazy counters at the start of training batches ``start`` and ``stop`` (both included only
    as boundaries: the window holds batches ``start`` to ``stop - 1``), or over the whole fit when ``stop`` is None.
    """

    def __init__(self, start: int = 0, stop: int | None = None) -> None:
        self.start = start
        self.stop = stop
        self.begin: hpu.LazyCounters | None = None
        self.end: hpu.LazyCounters | None = None

    def _read(self) -> hpu.LazyCounters:
        counters = hpu.get_backend().lazy_counters()
        assert counters is not None
        return counters

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.start and self.begin is None:
            self.begin = self._read()
        if batch_idx == self.stop:
            self.end = self._read()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.end is None:
            self.end = self._read()

    def delta(self, name: str) -> int:
        assert self.begin is not None, "the window never opened"
        assert self.end is not None, "the window never closed"
        return int(getattr(self.end, name) - getattr(self.begin, name))
