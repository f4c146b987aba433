"""Regional against whole compile of a 12-layer Hugging Face LLaMA (default config, ``use_cache=True``; tiny widths).

For each variant: the graphs dynamo compiled (``unique_graphs``), the graphs the decoder layers' shared forward holds,
the layers left uncompiled (a layer past the recompile limit runs eager), the first training step (compilation of
forward and backward) and the mean of the later steps, in seconds. Variants: whole model; regional (per layer) with
HPUCompile's default ``use_cache=False``; regional with the cache left on (``use_cache=None``, the behaviour before).

Run: ``python -m benchmarks.regional_decoder [--backend aot_eager|inductor] [--layers 12]``. Graph counts do not
depend on the backend; the times do (aot_eager traces without generating code). Writes
``benchmarks/out/regional_decoder.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

from benchmarks.common import log, machine, quiet
from lightning_gaudi.callbacks import HPUCompile, dynamo

VARIANTS: dict[str, dict[str, Any]] = {
    "whole": {"regional": False},
    "regional": {"regional": True},
    "regional, use_cache=True": {"regional": True, "use_cache": None},
}


class Decoder(LightningModule):
    def __init__(self, layers: int) -> None:
        super().__init__()
        import transformers

        config = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4, vocab_size=128
        )
        self.model = transformers.LlamaForCausalLM(config)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepTimes(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.times.append(time.perf_counter() - self._start)


def measure(variant: dict[str, Any], layers: int, steps: int) -> dict[str, Any]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    seed_everything(0, verbose=False)
    model, times = Decoder(layers), StepTimes()
    data = torch.utils.data.DataLoader(torch.randint(0, 128, (steps, 4, 32)), batch_size=None)
    with quiet(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(accelerator="hpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                          enable_model_summary=False, callbacks=[HPUCompile(**variant), times])  # fmt: skip
        trainer.fit(model, data)
    layer_graphs = dynamo.cache_entries(LlamaDecoderLayer.forward)
    limit = dynamo.recompile_limit() or 0
    return {
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "layer_graphs": layer_graphs,
        "uncompiled_layers": max(0, layers - layer_graphs) if variant["regional"] and layer_graphs >= limit else 0,
        "first_step_s": round(times.times[0], 3),
        "later_step_s": round(sum(times.times[1:]) / max(1, len(times.times) - 1), 4),
        "limit_warning": next((str(w.message) for w in caught if "recompile limit" in str(w.message)), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("LIGHTNING_GAUDI_EMULATE", "eager")  # here, not on import: benchmarks.features imports it
    os.environ["LIGHTNING_GAUDI_COMPILE_BACKEND"] = args.backend
    results = {name: measure(variant, args.layers, args.steps) for name, variant in VARIANTS.items()}
    out = Path(__file__).resolve().parent / "out" / "regional_decoder.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "backend": args.backend, "results": results}, indent=2))
    log(f"{args.layers}-layer LLaMA, {args.backend}: graphs, layer graphs, uncompiled layers, first/later step s")
    for name, r in results.items():
        log(f"  {name:26} {r['graphs']:3} {r['layer_graphs']:3} {r['uncompiled_layers']:3}"
            f" {r['first_step_s']:8.3f} {r['later_step_s']:8.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
