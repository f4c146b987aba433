"""Hugging Face models built from their configs (code this project did not write), trained as their users train them.

Each model is trained on the emulated HPU and, with the same seed and batches, by stock Lightning on the CPU; the
weights must agree. Dropout stays on: eager emulation draws from the CPU generator, as the CPU run does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from helpers.workload import quiet_trainer
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import HPUCompile, dynamo

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, STEPS = 96, 16, 4


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def bert(dropout: float = 0.1) -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=3,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return transformers.BertForSequenceClassification(config)


class HFModule(LightningModule):
    """``self.model(**batch)`` with the loss computed inside the Hugging Face model, as its users write it."""

    def __init__(self, build: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.model = build()
        self.causal = isinstance(self.model, transformers.GPT2LMHeadModel)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        input_ids, labels = batch
        loss = self.model(input_ids=input_ids, labels=input_ids if self.causal else labels).loss
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (STEPS * 4, SEQ), generator=generator)
    labels = torch.randint(0, 3, (STEPS * 4,), generator=generator)
    return DataLoader(TensorDataset(input_ids, labels), batch_size=4)


def fit(build: Callable[[], nn.Module], trainer: Trainer) -> HFModule:
    seed_everything(0, verbose=False)
    module = HFModule(build)
    trainer.fit(module, loader())
    return module


def on_cpu(build: Callable[[], nn.Module]) -> HFModule:
    return fit(build, quiet_trainer(accelerator="cpu", max_steps=STEPS))


def weights(module: HFModule) -> dict[str, Tensor]:
    return {name: value.detach().float().cpu() for name, value in module.model.state_dict().items()}


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.mark.parametrize("build", [gpt2, bert], ids=["gpt2", "bert"])
def test_trains_like_stock_lightning_on_the_cpu(eager_hpu: hpu.Backend, build: Callable[[], nn.Module]) -> None:
    trained = fit(build, quiet_trainer(accelerator="hpu", devices=1, max_steps=STEPS))
    torch.testing.assert_close(weights(trained), weights(on_cpu(build)))


def test_gpt2_regional_compile_matches_and_compiles_each_block_once(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    block = transformers.models.gpt2.modeling_gpt2.GPT2Block
    compiled = fit(
        gpt2, quiet_trainer(accelerator="hpu", devices=1, max_steps=STEPS, callbacks=[HPUCompile(regional=True)])
    )
    assert dynamo.cache_entries(block.forward) >= 1, "no GPT2Block graph was compiled"
    torch.testing.assert_close(weights(compiled), weights(on_cpu(gpt2)), rtol=1e-4, atol=1e-5)
    assert "forward" not in vars(compiled.model.transformer.h[0]), "the plain forward is back after fit"


def test_bert_bf16_mixed_stays_close_to_fp32(eager_hpu: hpu.Backend) -> None:
    seen: list[torch.dtype] = []
    mixed = HFModule(bert)
    mixed.model.classifier.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    seed_everything(0, verbose=False)
    mixed.model.load_state_dict(HFModule(bert).model.state_dict())  # the weights a fresh seeded build starts from
    quiet_trainer(accelerator="hpu", devices=1, max_steps=STEPS, precision="bf16-mixed").fit(mixed, loader())
    assert seen == [torch.bfloat16] * STEPS, "the matmuls ran outside bf16 autocast"
    reference = weights(on_cpu(bert))
    for name, value in weights(mixed).items():
        assert value.dtype == torch.float32, f"{name}: autocast must leave the weights in fp32"
        torch.testing.assert_close(value, reference[name], rtol=0.05, atol=0.02, msg=name)


def test_lazy_emulation_trains_bert_and_explains_gpt2(lazy_hpu: hpu.Backend) -> None:
    """Lazy Tensor Core runs BERT (without dropout: its random numbers come from another generator); GPT-2's fused
    QKV projection hits an LTC limit, which the error names as such."""
    no_dropout = lambda: bert(dropout=0.0)  # noqa: E731
    lazy = fit(no_dropout, quiet_trainer(accelerator="hpu", devices=1, max_steps=STEPS))
    torch.testing.assert_close(weights(lazy), weights(on_cpu(no_dropout)), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="limit of lazy emulation") as raised:
        fit(gpt2, quiet_trainer(accelerator="hpu", devices=1, max_steps=STEPS))
    message: Any = str(raised.value) + "".join(getattr(raised.value, "__notes__", []))
    assert "LIGHTNING_GAUDI_EMULATE=eager" in message
