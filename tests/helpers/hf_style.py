"""A small sequence classifier written the way Hugging Face transformers models are, and a LightningModule that
uses it the way transformers users do (``self.model(**batch)``), for the compile tests.

``transformers`` is not installed in the project's environment, so the model is hand-written in its style: a config
object, embeddings, an encoder whose layers are an ``nn.ModuleList``, an attention mask turned into an additive
bias, the loss computed inside ``forward`` when ``labels`` are given, and an output object with ``.loss`` and
``.logits``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader


@dataclass
class TinyConfig:
    vocab_size: int = 50
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 32
    max_position_embeddings: int = 64
    num_labels: int = 3
    pad_token_id: int = 0


@dataclass
class SequenceClassifierOutput:
    loss: Tensor | None
    logits: Tensor


class TinyEmbeddings(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class TinySelfAttention(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)

    def _heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_size).transpose(1, 2)

    def forward(self, hidden: Tensor, attention_bias: Tensor) -> Tensor:
        q, k, v = self._heads(self.query(hidden)), self._heads(self.key(hidden)), self._heads(self.value(hidden))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + attention_bias
        context = (scores.softmax(dim=-1) @ v).transpose(1, 2).flatten(2)
        return self.output(context)


class TinyLayer(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.attention = TinySelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size)

    def forward(self, hidden: Tensor, attention_bias: Tensor) -> Tensor:
        hidden = self.attention_norm(hidden + self.attention(hidden, attention_bias))
        return self.output_norm(hidden + self.output(F.gelu(self.intermediate(hidden))))


class TinyEncoder(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TinyLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden: Tensor, attention_bias: Tensor) -> Tensor:
        for layer in self.layer:
            hidden = layer(hidden, attention_bias)
        return hidden


class TinyForSequenceClassification(nn.Module):
    """``BertForSequenceClassification`` in miniature: ``model(input_ids=..., attention_mask=..., labels=...)``."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = TinyEmbeddings(config)
        self.encoder = TinyEncoder(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None
    ) -> SequenceClassifierOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        hidden = self.encoder(self.embeddings(input_ids), bias)
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class HFStyleClassifier(LightningModule):
    """Trains :class:`TinyForSequenceClassification` the transformers way: ``self.model(**batch)``."""

    def __init__(self, config: TinyConfig | None = None, lr: float = 1e-3) -> None:
        super().__init__()
        self.model = TinyForSequenceClassification(config or TinyConfig())
        self.lr = lr
        self.losses: list[Tensor] = []

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.model(**batch).loss
        self.losses.append(loss.detach())
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def token_samples(count: int, min_len: int, max_len: int, seed: int = 0, vocab: int = 50) -> list[dict[str, Any]]:
    """``count`` tokenized samples (``input_ids`` lists of ``min_len`` to ``max_len`` tokens, an int ``label``)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    samples = []
    for length in lengths:
        ids = torch.randint(1, vocab, (length,), generator=generator)
        samples.append({"input_ids": ids.tolist(), "labels": int(ids.sum()) % 3})
    return samples


def pad_to_longest(samples: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
    """Per-batch padding to the longest sample, what transformers' ``DataCollatorWithPadding`` does."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["labels"] for s in samples])}


def token_loader(samples: list[dict[str, Any]], batch_size: int = 4, collate_fn: Any = pad_to_longest) -> DataLoader:
    return DataLoader(samples, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)  # type: ignore[arg-type]
