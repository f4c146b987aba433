"""A small GPT-style language model, readable top to bottom.

A decoder-only transformer in the manner of nanoGPT: token and position embeddings, ``n_layer`` pre-norm blocks of
causal self-attention and an MLP, a final norm and a head tied to the token embedding. Attention goes through the
HPU seam's ``sdpa``, which is Gaudi's ``FusedSDPA`` where Intel's bridge is present and torch's
``scaled_dot_product_attention`` elsewhere. Shapes are static (fixed context length), and the training step does no
host work: the loss is logged as a tensor and read by Lightning only when it refreshes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from torch import Tensor, nn
from torchmetrics.text import Perplexity

from lightning_gaudi import HPUAccelerator, fuse_optimizer, hpu

Attention = Callable[..., Tensor]


def _attention_kernel() -> Attention:
    """The seam's SDPA when an HPU (real or emulated) is usable, else torch's (e.g. ``accelerator="cpu"``)."""
    return hpu.get_backend().sdpa if hpu.is_available() else F.scaled_dot_product_attention


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, attention: Attention) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}.")
        self.n_head = n_head
        # three projections rather than one split in three: torch's Lazy Tensor Core (lazy emulation) falls back to
        # the CPU on matmuls of split views
        self.query = nn.Linear(n_embd, n_embd)
        self.key = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)
        self.attention = attention

    def forward(self, x: Tensor) -> Tensor:
        batch, time, channels = x.shape
        # (batch, time, channels) -> (batch, heads, time, head size); under tensor parallelism each card has its heads
        q, k, v = (
            proj(x).view(batch, time, -1, channels // self.n_head).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        y = self.attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, time, -1)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, attention: Attention) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, attention)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The transformer: token ids ``(batch, time)`` in, next-token logits ``(batch, time, vocab_size)`` out."""

    positions: Tensor

    def __init__(
        self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        super().__init__()
        attention = _attention_kernel()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.register_buffer("positions", torch.arange(block_size), persistent=False)
        self.apply(self._init_weights)
        for name, param in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        time = idx.shape[1]
        x = self.drop(self.tok_emb(idx) + self.pos_emb(self.positions[:time]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class GPTLanguageModel(L.LightningModule):
    """Trains :class:`GPT` on next-token prediction; reports validation loss and perplexity.

    Args:
        vocab_size: number of token ids (256 for bytes).
        block_size: context length; must be at least the data's sequence length.
        n_layer: transformer blocks.
        n_head: attention heads per block.
        n_embd: width of the residual stream.
        dropout: dropout probability (0 for small, short runs).
        lr: peak learning rate of AdamW.
        weight_decay: AdamW weight decay, applied to weight matrices and embeddings (not to biases or norms).
        betas: AdamW betas.
        warmup_steps: linear warm-up steps before the cosine decay.
        min_lr_ratio: the learning rate decays to ``lr * min_lr_ratio`` at the end of training.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        self.val_perplexity = Perplexity()
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = (float(betas[0]), float(betas[1]))
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio

    def configure_model(self) -> None:
        """Under ``hpu_model_parallel``, applies the tensor-parallel (and FSDP2) plan of :mod:`gpt_recipe.parallel`."""
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from gpt_recipe.parallel import parallelize

            parallelize(self.model, self.device_mesh)

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, targets = batch
        loss = self._loss(self(inputs), targets)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        inputs, targets = batch
        logits = self(inputs)
        self.log("val/loss", self._loss(logits, targets), prog_bar=True, sync_dist=True)
        self.val_perplexity(logits.float(), targets)
        self.log("val/ppl", self.val_perplexity, prog_bar=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        inputs, targets = batch
        self.log("test/loss", self._loss(self(inputs), targets), sync_dist=True)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The most likely next byte at every position."""
        return self(batch[0]).argmax(dim=-1)

    def configure_optimizers(self) -> Any:
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.lr,
            betas=self.betas,
        )
        # Gaudi's FusedAdamW (fused clipping under bf16-mixed) on an HPU, built before the scheduler; sharded
        # strategies, whose ranks hold slices of the parameters, keep torch's
        sharded = isinstance(self.trainer.strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy))
        if isinstance(self.trainer.accelerator, HPUAccelerator) and not sharded:
            optimizer = fuse_optimizer(optimizer)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = min(self.warmup_steps, total)
        floor = self.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
