"""Compile mode on the emulated HPU: compiled against uncompiled speed, cold compile time, compilations for
variable-length data.

Three measurements, each short, one at a time:

- ``speed``: the benchmark model (``common.BenchModel``, 2 transformer blocks) trained uncompiled and through
  :class:`~lightning_gaudi.callbacks.HPUCompile` with inductor, alternated in rotating order; steps per wall-second
  and per CPU-second after warm-up (the compilation is in the warm-up), and the ratio per repetition.
- ``cold``: the first training step (forward and backward compiled, inductor) of a 4-block model compiled whole
  against regionally (``HPUCompile(regional=True)``: one block compiled, reused by the others), each in a fresh
  process with an empty inductor cache; and the steps/s after it.
- ``shapes``: a BERT-like classifier on variable-length sequences (lengths 8 to 128, skewed short), batch 16, one
  epoch, with per-batch padding (what transformers' ``DataCollatorWithPadding`` does) under ``dynamic=False`` /
  torch's default (``None``) / ``True``, with :class:`~lightning_gaudi.data.BucketedPadCollate` (4 buckets at the
  length quantiles), each also on length-grouped batches (transformers' ``group_by_length``: similar lengths in
  one batch), and with padding to the longest sample of the data set. Graph compilations come from
  :class:`~lightning_gaudi.callbacks.GraphDiagnostics`; padding is the share of padded tokens in the batches. The
  counts do not depend on the backend, so this section uses ``aot_eager`` (``--shapes-backend inductor`` for real
  compile times).
- ``ddp``: a 2-process ``hpu_parallel`` fit in compile mode of an 8-layer MLP (eight 1 MiB linear layers) for a few
  ``bucket_cap_mb`` values: how many sub-graphs dynamo's DDPOptimizer splits the compiled forward into (one per DDP
  gradient bucket, read by :class:`lightning_gaudi.callbacks.dynamo.DDPSplitRecorder`) and the step time after
  warm-up (rank 0). ``aot_eager`` by default (the split does not depend on the backend; ``--ddp-backend inductor``
  for real step times).

Run alone: ``python -m benchmarks.compile`` (``--quick`` for a smoke run with ``aot_eager`` everywhere). Writes
``benchmarks/out/compile.json`` and prints a table. :func:`run` and :func:`table_rows` are what the suite needs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor, nn
from torch.nn import functional as F

from benchmarks.common import (
    BenchModel,
    Workload,
    log,
    machine,
    make_loader,
    quiet,
    ratio_summary,
    summarize,
    trainer_kwargs,
)

HERE = Path(__file__).resolve().parent
SPEED_WORKLOAD = Workload(d_model=64, heads=4, blocks=2, seq=32, batch=32)
COLD_WORKLOAD = Workload(d_model=64, heads=4, blocks=4, seq=32, batch=32)
COMPILE_ENV = {"LIGHTNING_GAUDI_EMULATE": "eager"}
DDP_BUCKET_CAPS_MB = (1.0, 4.0, 25.0)
DDP_LAYERS, DDP_WIDTH = 8, 512  # 1 MiB of fp32 weights a layer
_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
BATCH = 16  # the shapes measurement's batch size


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Timer(Callback):
    """Times batch 0 (the compilation) and batches ``warmup`` to the last, on both clocks."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.first: float | None = None
        self.start: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None
        self.steps = 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self._first = time.perf_counter()
        if batch_idx == self.warmup:
            self.start = (time.perf_counter(), time.process_time())

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0:
            self.first = time.perf_counter() - self._first
        if batch_idx >= self.warmup:
            self.end = (time.perf_counter(), time.process_time())
            self.steps = batch_idx - self.warmup + 1

    def result(self) -> dict[str, float]:
        if self.start is None or self.end is None or self.first is None:
            raise RuntimeError(f"the timed window (batch 0, then batches {self.warmup} on) never closed")
        return {
            "first_step_s": self.first,
            "steps_per_s": self.steps / (self.end[0] - self.start[0]),
            "steps_per_cpu_s": self.steps / (self.end[1] - self.start[1]),
        }


def _fit_bench(workload: Workload, steps: int, warmup: int, callbacks: list[Callback]) -> dict[str, float]:
    seed_everything(0, verbose=False)
    timer = _Timer(warmup)
    with quiet():
        trainer = Trainer(**trainer_kwargs(steps, accelerator="hpu", callbacks=[*callbacks, timer]))
        trainer.fit(BenchModel(workload), make_loader(workload, steps))
    return timer.result()


# ----------------------------------------------------------------------------------------------------------------------
# speed: compiled against uncompiled
# ----------------------------------------------------------------------------------------------------------------------


def run_speed(quick: bool, backend: str) -> dict[str, Any]:
    from lightning_gaudi.callbacks import HPUCompile

    steps, warmup, repetitions = (6, 2, 1) if quick else (70, 10, 3)
    variants = ("uncompiled", "compiled")
    measured: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with _env(**COMPILE_ENV, LIGHTNING_GAUDI_COMPILE_BACKEND=backend):
        for repetition in range(repetitions):
            order = variants if repetition % 2 == 0 else variants[::-1]
            for variant in order:
                callbacks: list[Callback] = [HPUCompile()] if variant == "compiled" else []
                result = _fit_bench(SPEED_WORKLOAD, steps, warmup, callbacks)
                measured[variant].append(result)
                log(
                    f"  compile speed rep {repetition + 1}/{repetitions} {variant:>10}:"
                    f" {result['steps_per_s']:.1f} steps/s"
                )
    return {
        "backend": backend,
        "workload": SPEED_WORKLOAD.as_dict(),
        "steps": steps,
        "warmup_steps": warmup,
        "repetitions": repetitions,
        "steps_per_s": {v: summarize([r["steps_per_s"] for r in measured[v]]) for v in variants},
        "steps_per_cpu_s": {v: summarize([r["steps_per_cpu_s"] for r in measured[v]]) for v in variants},
        "first_step_s": {v: summarize([r["first_step_s"] for r in measured[v]]) for v in variants},
        "ratio_wall": ratio_summary(
            [r["steps_per_s"] for r in measured["compiled"]], [r["steps_per_s"] for r in measured["uncompiled"]]
        ),
        "ratio_cpu": ratio_summary(
            [r["steps_per_cpu_s"] for r in measured["compiled"]], [r["steps_per_cpu_s"] for r in measured["uncompiled"]]
        ),
    }


# ----------------------------------------------------------------------------------------------------------------------
# cold compile: whole against regional, each in a fresh process with an empty inductor cache
# ----------------------------------------------------------------------------------------------------------------------


def _cold_child(variant: str, steps: int) -> dict[str, Any]:
    """Runs in the child process: one fit, the first step timed (the compilation), then the steady steps."""
    import lightning_gaudi  # noqa: F401 - registers "hpu"
    from lightning_gaudi.callbacks import GraphDiagnostics, HPUCompile

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    diagnostics = GraphDiagnostics(warmup_steps=1)
    result = _fit_bench(COLD_WORKLOAD, steps, 2, [HPUCompile(regional=variant == "regional"), diagnostics])
    result["compiled_graphs"] = diagnostics.summary["compiled_graphs"]
    result["graph_compilations"] = diagnostics.summary["graph_compilations"]
    return result


def run_cold(quick: bool, backend: str) -> dict[str, Any]:
    steps, repetitions = (4, 1) if quick else (12, 2)
    variants = ("whole", "regional")
    measured: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for repetition in range(repetitions):
        order = variants if repetition % 2 == 0 else variants[::-1]
        for variant in order:
            with tempfile.TemporaryDirectory(prefix="inductor_cold_") as cache:
                env = {**os.environ, **COMPILE_ENV, "LIGHTNING_GAUDI_COMPILE_BACKEND": backend}
                env["TORCHINDUCTOR_CACHE_DIR"] = cache
                env["OMP_NUM_THREADS"] = "1"
                command = [sys.executable, "-m", "benchmarks.compile", "--cold-child", variant, "--steps", str(steps)]
                proc = subprocess.run(command, cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"cold compile child ({variant}) failed:\n{proc.stderr[-4000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            measured[variant].append(result)
            log(
                f"  cold compile rep {repetition + 1}/{repetitions} {variant:>8}:"
                f" first step {result['first_step_s']:.1f} s,"
                f" {result['compiled_graphs']} graphs"
            )
    return {
        "backend": backend,
        "workload": COLD_WORKLOAD.as_dict(),
        "repetitions": repetitions,
        "first_step_s": {v: summarize([r["first_step_s"] for r in measured[v]]) for v in variants},
        "steps_per_s": {v: summarize([r["steps_per_s"] for r in measured[v]]) for v in variants},
        "compiled_graphs": {v: measured[v][0]["compiled_graphs"] for v in variants},
        "ratio_first_step_whole/regional": ratio_summary(
            [r["first_step_s"] for r in measured["whole"]], [r["first_step_s"] for r in measured["regional"]]
        ),
    }


# ----------------------------------------------------------------------------------------------------------------------
# shapes: variable-length data
# ----------------------------------------------------------------------------------------------------------------------


class _Layer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        x = self.norm1(x + self.attention(x, x, x, key_padding_mask=padding, need_weights=False)[0])
        return self.norm2(x + self.mlp(x))


class _Classifier(nn.Module):
    """BERT-like: embeddings, a ModuleList of layers, mean pooling over the mask, the loss inside forward."""

    def __init__(self, vocab: int = 1000, d: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d, padding_idx=0)
        self.positions = nn.Embedding(max_len, d)
        self.layer = nn.ModuleList(_Layer(d, heads) for _ in range(layers))
        self.classifier = nn.Linear(d, 2)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for layer in self.layer:
            x = layer(x, attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(x.dtype)
        logits = self.classifier((x * mask).sum(1) / mask.sum(1))
        return F.cross_entropy(logits, labels), logits


class _Task(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = _Classifier()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self.model(**batch)[0]

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _samples(count: int, seed: int = 0) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(seed)
    # skewed to short sequences, as text usually is: 8 + an exponential tail, capped at 128
    lengths = (8 + torch.empty(count).exponential_(1 / 30, generator=generator)).clamp(max=128).long().tolist()
    return [{"input_ids": torch.randint(1, 1000, (n,), generator=generator).tolist(), "labels": n % 2} for n in lengths]


def _grouped_by_length(samples: list[dict[str, Any]], batch_size: int, chunk_batches: int = 8) -> list[Any]:
    """The samples reordered so batches hold similar lengths (transformers' ``group_by_length``): sorted by length
    within chunks of ``chunk_batches`` batches, the batches then shuffled (seeded)."""
    chunk = batch_size * chunk_batches
    ordered: list[dict[str, Any]] = []
    for start in range(0, len(samples), chunk):
        ordered += sorted(samples[start : start + chunk], key=lambda s: len(s["input_ids"]))
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(0)).tolist()
    return [sample for index in order for sample in batches[index]]


def _pad_to(length: int | None) -> Any:
    """Pads each batch to ``length``, or to its longest sample when ``None`` (DataCollatorWithPadding)."""

    def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        width = length or max(len(s["input_ids"]) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        mask = torch.zeros(len(samples), width, dtype=torch.long)
        for row, sample in enumerate(samples):
            ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
            mask[row, : len(sample["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["labels"] for s in samples])}

    return collate


def _padding_share(loader: Any) -> float:
    real = total = 0
    for batch in loader:
        real += int(batch["attention_mask"].sum())
        total += batch["attention_mask"].numel()
    return 1 - real / total


def run_shapes(quick: bool, backend: str) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from lightning_gaudi.callbacks import GraphDiagnostics, HPUCompile
    from lightning_gaudi.data import BucketedPadCollate

    samples = _samples(64 if quick else 256)
    lengths = [len(s["input_ids"]) for s in samples]
    buckets = BucketedPadCollate.quantile_buckets(lengths, count=4)
    grouped = _grouped_by_length(samples, BATCH)
    variants: dict[str, tuple[Any, bool | None, list[dict[str, Any]]]] = {
        "per-batch padding, dynamic=False": (_pad_to(None), False, samples),
        "per-batch padding, dynamic=None (torch's default)": (_pad_to(None), None, samples),
        "per-batch padding, dynamic=True": (_pad_to(None), True, samples),
        f"BucketedPadCollate {buckets}, dynamic=False": (BucketedPadCollate(buckets), False, samples),
        "length-grouped batches, per-batch padding, dynamic=False": (_pad_to(None), False, grouped),
        f"length-grouped batches, BucketedPadCollate {buckets}, dynamic=False": (
            BucketedPadCollate(buckets),
            False,
            grouped,
        ),
        f"padded to the longest ({max(lengths)}), dynamic=False": (_pad_to(max(lengths)), False, samples),
    }
    results: dict[str, Any] = {}
    with _env(**COMPILE_ENV, LIGHTNING_GAUDI_COMPILE_BACKEND=backend):
        for name, (collate, dynamic, data) in variants.items():
            torch.compiler.reset()
            seed_everything(0, verbose=False)
            loader: DataLoader[Any] = DataLoader(data, batch_size=BATCH, shuffle=False, collate_fn=collate)  # type: ignore[arg-type]
            diagnostics = GraphDiagnostics(warmup_steps=1)
            started = time.perf_counter()
            with quiet():
                trainer = Trainer(
                    **trainer_kwargs(
                        len(loader), accelerator="hpu", callbacks=[HPUCompile(dynamic=dynamic), diagnostics]
                    )
                )
                trainer.fit(_Task(), loader)
            seconds = time.perf_counter() - started
            s = diagnostics.summary
            results[name] = {
                "batches": len(loader),
                "distinct_shapes": s["distinct_input_shapes"],
                "graph_compilations": s["graph_compilations"],
                "recompile_limit_hit": s["recompile_limit_hit"],
                "padding_share": _padding_share(loader),
                "fit_seconds": seconds,
            }
            log(f"  shapes {name}: {results[name]}")
    torch.compiler.reset()
    return {"backend": backend, "samples": len(samples), "buckets": buckets, "variants": results}


# ----------------------------------------------------------------------------------------------------------------------
# ddp: DDPOptimizer's sub-graphs against bucket_cap_mb, 2 processes
# ----------------------------------------------------------------------------------------------------------------------


class _Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(DDP_WIDTH, DDP_WIDTH) for _ in range(DDP_LAYERS))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return x


class _DDPModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = _Layers()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return ((self.model(x) - y) ** 2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _ddp_child(bucket_cap_mb: float, steps: int, out: Path) -> None:
    """Runs in both ranks (Lightning's launcher re-runs this command for rank 1): one fit, each rank writes its JSON."""
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_gaudi  # noqa: F401 - registers "hpu"
    from lightning_gaudi import HPUParallelStrategy
    from lightning_gaudi.callbacks import HPUCompile, dynamo

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(steps * 16, DDP_WIDTH), torch.randn(steps * 16, DDP_WIDTH))
    timer = _Timer(2)
    trainer = Trainer(
        **trainer_kwargs(
            steps,
            accelerator="hpu",
            devices=2,
            strategy=HPUParallelStrategy(bucket_cap_mb=bucket_cap_mb),
            callbacks=[timer],
            enable_progress_bar=False,
        )
    )
    with dynamo.DDPSplitRecorder() as recorder:
        trainer.fit(_DDPModel(), DataLoader(data, batch_size=16))
    compilers = [c for c in trainer.callbacks if isinstance(c, HPUCompile)]  # type: ignore[attr-defined]
    result = {
        **timer.result(),
        "splits": recorder.splits,
        "compiled": sorted(compilers[0].compiled) if compilers else [],
        "world_size": trainer.world_size,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


def run_ddp(quick: bool, backend: str) -> dict[str, Any]:
    steps = 6 if quick else 20
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in _LAUNCH_VARS:  # a fresh launch each time: Lightning picks a free port
        env.pop(name, None)
    env.update({**COMPILE_ENV, "LIGHTNING_GAUDI_COMPILE": "1", "LIGHTNING_GAUDI_COMPILE_BACKEND": backend})
    env["OMP_NUM_THREADS"] = "1"
    caps: dict[str, Any] = {}
    for cap in DDP_BUCKET_CAPS_MB:
        with tempfile.TemporaryDirectory(prefix="ddp_compile_") as out:
            command = [sys.executable, "-m", "benchmarks.compile", "--ddp-child", str(cap), "--steps", str(steps)]
            command += ["--ddp-out", out]
            proc = subprocess.run(command, cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"DDP compile child (bucket_cap_mb={cap}) failed:\n{proc.stderr[-4000:]}")
            ranks = [json.loads((Path(out) / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        if ranks[0]["splits"] != ranks[1]["splits"]:
            raise RuntimeError(f"the ranks split differently at bucket_cap_mb={cap}: {[r['splits'] for r in ranks]}")
        result = ranks[0]
        caps[f"{cap:g}"] = {
            "sub_graphs": sum(result["splits"]),
            "splits": result["splits"],
            "compiled": result["compiled"],
            "step_ms": 1000 / result["steps_per_s"],
            "first_step_s": result["first_step_s"],
            "world_size": result["world_size"],
        }
        measured = caps[f"{cap:g}"]
        log(
            f"  ddp compile bucket_cap_mb={cap:g}: {measured['sub_graphs']} sub-graphs,"
            f" {measured['step_ms']:.1f} ms/step"
        )
    return {
        "backend": backend,
        "layers": DDP_LAYERS,
        "layer_mib": DDP_WIDTH * (DDP_WIDTH + 1) * 4 / 2**20,
        "steps": steps,
        "bucket_cap_mb": caps,
    }


# ----------------------------------------------------------------------------------------------------------------------
# the section
# ----------------------------------------------------------------------------------------------------------------------


def run(
    quick: bool = False, backend: str | None = None, shapes_backend: str = "aot_eager", ddp_backend: str = "aot_eager"
) -> dict[str, Any]:
    """All four measurements. ``backend``: inductor (``aot_eager`` under ``quick``)."""
    import lightning_gaudi  # noqa: F401 - registers "hpu"

    backend = backend or ("aot_eager" if quick else "inductor")
    return {
        "speed": run_speed(quick, backend),
        "cold": run_cold(quick, backend),
        "shapes": run_shapes(quick, "aot_eager" if quick else shapes_backend),
        "ddp": run_ddp(quick, "aot_eager" if quick else ddp_backend),
    }


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows for ``benchmarks/report.py``'s table: (measurement, result, target, met)."""

    def spread(summary: dict[str, Any], fmt: str) -> str:
        return f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}})"

    rows: list[tuple[str, str, str, str]] = []
    if "speed" in result:
        rows += _speed_rows(result["speed"], spread)
    if "cold" in result:
        rows += _cold_rows(result["cold"], spread)
    if "shapes" in result:
        rows += _shapes_rows(result["shapes"])
    if "ddp" in result:
        rows += _ddp_rows(result["ddp"])
    return rows


def _speed_rows(speed: dict[str, Any], spread: Callable[[dict[str, Any], str], str]) -> list[tuple[str, str, str, str]]:
    rows = [
        (
            f"compile ({speed['backend']}): {variant}, steps per wall-second / per CPU-second",
            f"{spread(speed['steps_per_s'][variant], '.1f')} / {spread(speed['steps_per_cpu_s'][variant], '.1f')}",
            "",
            "",
        )
        for variant in speed["steps_per_s"]
    ]
    rows.append(
        (
            "compile: compiled / uncompiled speed, wall clock / CPU time",
            f"{spread(speed['ratio_wall'], '.2f')} / {spread(speed['ratio_cpu'], '.2f')}",
            "",
            "",
        )
    )
    return rows


def _cold_rows(cold: dict[str, Any], spread: Callable[[dict[str, Any], str], str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for variant in cold["first_step_s"]:
        rows.append(
            (
                f"compile cold ({cold['backend']}, {cold['workload']['blocks']} blocks): {variant}, first step s;"
                " graphs; steps/s after",
                f"{spread(cold['first_step_s'][variant], '.1f')}; {cold['compiled_graphs'][variant]};"
                f" {spread(cold['steps_per_s'][variant], '.1f')}",
                "",
                "",
            )
        )
    rows.append(
        (
            "compile cold: first step whole / regional",
            spread(cold["ratio_first_step_whole/regional"], ".2f"),
            "",
            "",
        )
    )
    return rows


def _shapes_rows(shapes: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, v in shapes["variants"].items():
        rows.append(
            (
                f"compile shapes ({shapes['backend']}, {shapes['samples']} samples, {v['batches']} batches): {name}",
                f"{v['distinct_shapes']} shapes, {v['graph_compilations']} compilations"
                f"{', recompile limit hit' if v['recompile_limit_hit'] else ''}, {v['padding_share']:.0%} padding,"
                f" fit {v['fit_seconds']:.1f} s",
                "",
                "",
            )
        )
    return rows


def _ddp_rows(ddp: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [
        (
            f"compile + DDP ({ddp['backend']}, 2 processes, {ddp['layers']} x {ddp['layer_mib']:.1f} MiB layers):"
            f" bucket_cap_mb={cap}, DDPOptimizer sub-graphs; step ms",
            f"{v['sub_graphs']}; {v['step_ms']:.1f}",
            "",
            "",
        )
        for cap, v in ddp["bucket_cap_mb"].items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with aot_eager; its numbers mean nothing")
    parser.add_argument("--only", default="speed,cold,shapes,ddp", help="comma-separated: speed, cold, shapes, ddp")
    parser.add_argument("--shapes-backend", default="aot_eager", help="the backend of the shapes measurement")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "compile.json")
    parser.add_argument("--ddp-backend", default="aot_eager", help="the backend of the ddp measurement")
    parser.add_argument("--cold-child", choices=("whole", "regional"), help=argparse.SUPPRESS)
    parser.add_argument("--ddp-child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=12, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cold_child:
        print(json.dumps(_cold_child(args.cold_child, args.steps)))
        return 0
    if args.ddp_child is not None:
        _ddp_child(args.ddp_child, args.steps, args.ddp_out)
        return 0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    import lightning_gaudi  # noqa: F401

    backend = "aot_eager" if args.quick else "inductor"
    only = {name.strip() for name in args.only.split(",")}
    result: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    if "speed" in only:
        result["speed"] = run_speed(args.quick, backend)
    if "cold" in only:
        result["cold"] = run_cold(args.quick, backend)
    if "shapes" in only:
        result["shapes"] = run_shapes(args.quick, "aot_eager" if args.quick else args.shapes_backend)
    if "ddp" in only:
        result["ddp"] = run_ddp(args.quick, "aot_eager" if args.quick else args.ddp_backend)
    result["machine_at_end"] = {"load_average_1min": machine()["load_average_1min"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    for row in table_rows(result):
        print(f"| {row[0]} | {row[1]} |")
    m = result["machine"]
    print(f"\nmachine: {m['cpu']}, {m['usable_cores']} cores, torch {m['torch']}, load {m['load_average_1min']:.1f}")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
