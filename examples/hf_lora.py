"""LoRA fine-tuning of a Hugging Face LLaMA with PEFT, written as for GPUs: it never imports lightning_gaudi.

On a Gaudi (or the emulator) run it through ``python -m lightning_gaudi``, which registers the HPU first; Lightning's
automatic choices then pick the HPU and ``hpu_parallel``::

    python -m lightning_gaudi examples/hf_lora.py --devices 8
    python examples/hf_lora.py --accelerator cpu --devices 2      # the same code on the CPU, for comparison

The model is built from a small config (nothing is downloaded) and trained on seeded random tokens; the LoRA weights
are saved to ``--out`` (``lora.pt``). Needs ``transformers`` and ``peft``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ = 128, 32


class LoRAModule(L.LightningModule):
    def __init__(self, rank: int = 8, lr: float = 1e-3) -> None:
        super().__init__()
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
        )
        lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        self.model = get_peft_model(LlamaForCausalLM(config), lora)
        self.lr = lr

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        loss = self.model(input_ids=tokens, labels=tokens).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trainable = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(trainable, lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("lora-out"))
    args = parser.parse_args()
    L.seed_everything(0)
    tokens = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(tokens), batch_size=4)
    module = LoRAModule()
    devices = args.devices if args.devices == "auto" else int(args.devices)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=devices,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    if trainer.is_global_zero:
        args.out.mkdir(parents=True, exist_ok=True)
        lora = {name: p.detach().cpu() for name, p in module.named_parameters() if "lora_" in name}
        torch.save({"lora": lora, "strategy": type(trainer.strategy).__name__}, args.out / "lora.pt")


if __name__ == "__main__":
    main()
