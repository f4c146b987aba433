"""What lazy emulation cannot run, said out loud: torch's Lazy Tensor Core hands back CPU tensors for the pieces of
``split``/``chunk``/``unbind``, so modules that cut one projection in pieces (``nn.MultiheadAttention`` with its own
key and value, Hugging Face GPT-2's fused QKV) fail with LTC's own message. The seam recognizes those errors and
rewrites them to name the limit and the way out; nothing runs per step for it."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import hpu

FEATURES = 8


class GatedChunks(L.LightningModule):
    """A gated linear unit cut with ``chunk`` (as GLU/SwiGLU blocks are), in the training and the validation step."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(FEATURES, 2 * FEATURES)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.gate(x).chunk(2, dim=-1)
        return x + value * torch.sigmoid(gate)

    def training_step(self, batch: tuple[Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).pow(2).mean()

    def validation_step(self, batch: tuple[Tensor], batch_idx: int) -> None:
        self.log("val_loss", self(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 3, FEATURES)), batch_size=4)


def _trainer() -> L.Trainer:
    return L.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
    )


def _ltc_error(run: Any) -> RuntimeError:
    with pytest.raises(RuntimeError) as info:
        run()
    return info.value


def _assert_explained(error: BaseException, original: str) -> None:
    message = str(error)
    assert message.startswith(original)  # LTC's own words stay first
    assert "limit of lazy emulation" in message
    assert "split/chunk/unbind" in message
    assert "LIGHTNING_GAUDI_EMULATE=eager" in message
    assert "LIGHTNING_GAUDI_COMPILE=1" in message  # compile mode


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_chunk_in_a_step_fails_naming_the_limit_and_the_way_out(lazy_hpu: hpu.Backend, stage: str) -> None:
    trainer = _trainer()
    with pytest.raises(RuntimeError, match="Input tensor is not a lazy tensor") as info:
        getattr(trainer, stage)(GatedChunks(), _loader())
    _assert_explained(info.value, "Input tensor is not a lazy tensor")


def test_the_same_module_runs_in_eager_emulation(eager_hpu: hpu.Backend) -> None:
    """The way out the message names works."""
    trainer = _trainer()
    trainer.fit(GatedChunks(), _loader())
    assert trainer.global_step == 2


def test_multihead_attention_with_its_own_keys(lazy_hpu: hpu.Backend) -> None:
    """torch's own module (code this project did not write): key and value projections come from one ``split``."""
    attention = nn.MultiheadAttention(FEATURES, 2, batch_first=True).to(lazy_hpu.device())
    query, memory = (torch.randn(2, 3, FEATURES).to(lazy_hpu.device()) for _ in range(2))
    error = _ltc_error(lambda: attention(query, memory, memory))
    original = str(error)
    assert hpu.explain_error(error)
    _assert_explained(error, original)


def test_backward_through_chunk_pieces(lazy_hpu: hpu.Backend) -> None:
    """When every operand is a piece, the forward passes and autograd fails instead, with another message."""
    linear = nn.Linear(FEATURES, 2 * FEATURES).to(lazy_hpu.device())
    first, second = linear(torch.randn(4, FEATURES).to(lazy_hpu.device())).chunk(2, dim=-1)
    error = _ltc_error(lambda: (first * second).sum().backward())
    original = str(error)
    assert "expected device lazy" in original
    assert lazy_hpu.explain_error(error)
    _assert_explained(error, original)


def test_only_lazy_tensor_core_errors_are_rewritten(lazy_hpu: hpu.Backend) -> None:
    unrelated = RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x2)")
    assert not lazy_hpu.explain_error(unrelated)
    assert unrelated.args == ("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x2)",)
    assert not lazy_hpu.explain_error(ValueError("Input tensor is not a lazy tensor"))  # only torch's RuntimeError
    internal = RuntimeError(
        'common_device INTERNAL ASSERT FAILED at "/pytorch/torch/csrc/lazy/generated/LazyNativeFunctions.cpp":1020'
    )
    assert lazy_hpu.explain_error(internal)  # an LTC internal assert (what Hugging Face's KV cache runs into)
    once = str(internal)
    assert not lazy_hpu.explain_error(internal)  # already explained: said once
    assert str(internal) == once


def test_eager_emulation_rewrites_nothing(eager_hpu: hpu.Backend) -> None:
    error = RuntimeError("Input tensor is not a lazy tensor: torch.FloatTensor")
    assert not eager_hpu.explain_error(error)
    assert not hpu.explain_error(error)
    assert str(error) == "Input tensor is not a lazy tensor: torch.FloatTensor"


def test_explain_error_without_a_backend_never_raises(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "bogus")  # what a strategy's on_exception may meet during set-up
    assert not hpu.explain_error(RuntimeError("Input tensor is not a lazy tensor: torch.FloatTensor"))
