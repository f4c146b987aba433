"""Swapping nn.Linear layers for FP8 ones, and the state dicts the converted model writes and reads."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.fp8 import FP8Linear, FP8Recipe, FP8Training, convert_linear_layers


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(48, 32)
        self.shared = nn.Linear(32, 32)
        self.blocks = nn.Sequential(self.shared, nn.ReLU(), self.shared, nn.Linear(32, 10), nn.Linear(10, 48))
        self.head = nn.Linear(32, 48, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        return self.head(self.shared(h)) + self.blocks(h)


def _convert(model: nn.Module, recipe: FP8Recipe | None = None) -> nn.Module:
    converted, _ = convert_linear_layers(
        model, lambda linear: FP8Linear.from_linear(linear, recipe), lambda m: isinstance(m, FP8Linear)
    )
    return converted


def test_layers_are_swapped_keeping_their_parameters() -> None:
    model = Net()
    before = dict(model.named_parameters())
    converted, conversion = convert_linear_layers(
        model, lambda linear: FP8Linear.from_linear(linear), lambda m: isinstance(m, FP8Linear)
    )
    assert converted is model
    assert isinstance(model.shared, FP8Linear)
    assert isinstance(model.head, FP8Linear)
    assert model.blocks[0] is model.blocks[2] is model.shared  # a shared layer stays one layer
    assert model.head.weight is model.embed.weight  # tied weights stay tied
    assert dict(model.named_parameters()) == before  # the same Parameter objects, under the same names
    assert conversion.converted == ["shared", "head"]
    assert conversion.skipped == ["blocks.3 (32 -> 10)", "blocks.4 (10 -> 48)"]
    assert type(model.blocks[3]) is nn.Linear
    # converting again changes nothing
    assert convert_linear_layers(model, FP8Linear.from_linear, lambda m: isinstance(m, FP8Linear))[1].converted == []


def test_a_bare_linear_is_replaced() -> None:
    layer = nn.Linear(16, 16)
    converted = _convert(layer)
    assert isinstance(converted, FP8Linear)
    assert converted.weight is layer.weight


def test_the_skipped_layers_are_listed_once(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        FP8Training(FP8Recipe()).convert(Net())
    lines = [r.getMessage() for r in caplog.records if "FP8:" in r.getMessage()]
    assert lines == [
        "FP8: 2 linear layer(s) run in emulated FP8 (FP8Linear, recipe hybrid); 2 left in bf16 (in/out features not"
        " multiples of 16): blocks.3 (32 -> 10), blocks.4 (10 -> 48)."
    ]


def test_a_model_without_fp8_layers_is_warned_about(eager_hpu: hpu.Backend) -> None:
    with pytest.warns(UserWarning, match="computes nothing in FP8"):
        FP8Training(FP8Recipe()).convert(nn.Sequential(nn.Linear(10, 3)))


def test_state_dict_keys_are_nn_linears() -> None:
    torch.manual_seed(0)
    model = _convert(Net())
    from lightning_gaudi.fp8 import fp8_autocast

    with fp8_autocast():
        model(torch.randint(0, 48, (2, 5))).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state = model.state_dict()
    plain = Net()
    assert list(state) == list(plain.state_dict())  # the same keys, in the same order
    plain.load_state_dict(state)  # strict, without FP8
    for key, value in plain.state_dict().items():
        assert torch.equal(value, state[key]), key
    model.load_state_dict(Net().state_dict())  # and a plain checkpoint into the FP8 model, strict
    assert model.shared.fp8_steps.item() == 3  # its scaling state is not the model's state


def test_scaling_state_round_trips_through_the_plugin_state(eager_hpu: hpu.Backend) -> None:
    from lightning_gaudi.fp8 import fp8_autocast

    training = FP8Training(FP8Recipe(amax_history_len=8))
    model = training.convert(Net())
    with fp8_autocast():
        model(torch.randint(0, 48, (2, 5))).sum().backward()
    state = training.state_dict()
    assert set(state) == {"shared", "head"}  # the shared layer once, under the name it was found under first
    assert state["shared"]["fp8_steps"].item() == 3  # it ran three times
    other_training = FP8Training(FP8Recipe(amax_history_len=8))
    other = other_training.convert(Net())
    other_training.load_state_dict(state)
    assert torch.equal(other.shared.fp8_scale, model.shared.fp8_scale)
    assert torch.equal(other.head.fp8_amax_history, model.head.fp8_amax_history)
    shorter = FP8Training(FP8Recipe(amax_history_len=4))
    shorter.convert(Net())
    with pytest.raises(ValueError, match=r"Resume with the same recipe"):
        shorter.load_state_dict(state)
    fresh = FP8Training(FP8Recipe())
    fresh.convert(nn.Sequential(nn.Linear(16, 16)))
    with pytest.raises(ValueError, match=r"holds FP8 scaling state for layers \['head', 'shared'\]"):
        fresh.load_state_dict(state)
