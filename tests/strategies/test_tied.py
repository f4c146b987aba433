"""Tied weights (a head sharing the embedding's weight) stay tied when the strategies move the model to the HPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers.models import trainer_kwargs
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import HPUAccelerator, HPUParallelStrategy, SingleHPUStrategy, hpu
from lightning_gaudi.strategies._tied import find_tied_parameters, move_keeping_ties

VOCAB, WIDTH = 32, 8


class TiedLM(LightningModule):
    """A bigram language model whose output head shares the token embedding's weight, as GPT-2 does."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight
        self.seen: dict[str, Any] = {}

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.norm(self.tok_emb(tokens)))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        tokens, targets = batch
        logits = self(tokens)
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    def on_train_start(self) -> None:
        optimizer = self.trainer.optimizers[0]
        self.seen = {
            "tied": self.head.weight is self.tok_emb.weight,
            "parameters": sum(p.numel() for p in self.parameters()),
            "optimized": sum(p.numel() for group in optimizer.param_groups for p in group["params"]),
            "device": self.head.weight.device.type,
        }

    def on_train_end(self) -> None:
        self.seen["tied_at_end"] = self.head.weight is self.tok_emb.weight

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (8, 6), generator=generator)
        return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)


CPU_PARAMETERS = VOCAB * WIDTH + 2 * WIDTH  # the shared weight once, and the norm


@pytest.fixture
def overwriting_conversion() -> Iterator[None]:
    """``Module.to`` makes new parameters even for a move it could do in place: ties come apart on the CPU too."""
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_finds_the_groups() -> None:
    model = TiedLM()
    assert sum(p.numel() for p in model.parameters()) == CPU_PARAMETERS
    assert find_tied_parameters(model) == [["tok_emb.weight", "head.weight"]]
    assert find_tied_parameters(nn.Linear(2, 2)) == []


def test_lazy_emulation_keeps_the_tie(lazy_hpu: hpu.Backend) -> None:
    """torch's Lazy Tensor Core cannot convert in place: ``.to("lazy")`` alone unties (the GPT recipe's 875K)."""
    untied = TiedLM().to(lazy_hpu.device())
    assert untied.head.weight is not untied.tok_emb.weight, "LTC keeps ties now: the fix may be unnecessary"

    model = TiedLM()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=2))
    trainer.fit(model)
    assert model.seen == {
        "tied": True,
        "parameters": CPU_PARAMETERS,
        "optimized": CPU_PARAMETERS,
        "device": "lazy",
        "tied_at_end": True,
    }
    # after fit Lightning moves the model back to the CPU, which would untie it again
    assert model.head.weight is model.tok_emb.weight
    assert model.head.weight.device.type == "cpu"
    assert sum(p.numel() for p in model.parameters()) == CPU_PARAMETERS


def test_eager_emulation_keeps_the_tie(eager_hpu: hpu.Backend, overwriting_conversion: None) -> None:
    model = TiedLM()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=2))
    trainer.fit(model)
    assert model.seen == {
        "tied": True,
        "parameters": CPU_PARAMETERS,
        "optimized": CPU_PARAMETERS,
        "device": "cpu",
        "tied_at_end": True,
    }


@pytest.mark.parametrize("strategy_class", [SingleHPUStrategy, HPUParallelStrategy])
def test_each_strategy_moves_keeping_ties(
    eager_hpu: hpu.Backend, overwriting_conversion: None, strategy_class: type
) -> None:
    if strategy_class is HPUParallelStrategy:
        strategy = HPUParallelStrategy(accelerator=HPUAccelerator(), parallel_devices=[eager_hpu.device()])
    else:
        strategy = SingleHPUStrategy(accelerator=HPUAccelerator())
    model = TiedLM()
    strategy.model = model
    strategy.model_to_device()
    assert model.head.weight is model.tok_emb.weight
    assert sum(p.numel() for p in model.parameters()) == CPU_PARAMETERS


def test_moves_a_model_with_two_groups_and_a_triple(overwriting_conversion: None) -> None:
    model = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3), "c": nn.Linear(3, 3), "d": nn.Linear(3, 3)})
    model["b"].weight = model["a"].weight
    model["c"].weight = model["a"].weight
    model["d"].bias = model["a"].bias
    move_keeping_ties(model, torch.device("cpu"))
    assert model["a"].weight is model["b"].weight is model["c"].weight
    assert model["d"].bias is model["a"].bias
    assert model["d"].weight is not model["a"].weight
