"""Benchmarks on the models users train: Hugging Face GPT-2 and LLaMA under stock Lightning and lightning_gaudi.

``python -m benchmarks.hf_models [--quick] [--backend inductor|aot_eager] [--only TABLES] [--out DIR]``

Both models are small, randomly initialised and built from configs (:data:`CONFIGS`; nothing is downloaded), and
wrapped in one LightningModule (:class:`CausalLM`: the causal LM loss with the input ids as labels, AdamW, the loss
logged with ``self.log("loss", prog_bar=True)`` every step), trained on random token batches (:data:`BATCH` sequences
of :data:`SEQ` tokens). Four tables, each with an A/A control (a variant run twice) that shows how far two runs of
the same code differ on this machine, the noise floor of every ratio:

1. **Overhead, 1 process.** ``stock`` (``Trainer(accelerator="cpu")``, Lightning's defaults), ``stock_again`` (the
   same again: the A/A control) and ``plugin`` (``Trainer(accelerator="hpu")`` on the eager emulated HPU, the
   plugin's defaults), alternated in rotating order in this process; steps per CPU-second of the process and per
   wall-clock second after warm-up, and the per-repetition ratios to ``stock``.
2. **Overhead, 2 processes.** The same three variants under DDP: stock ``strategy="ddp"`` on the CPU against
   ``hpu_parallel`` (preemption checkpointing on, the default), each a fresh pair of processes (Lightning's popen
   launcher, gloo), rotating order; rank 0's steps/s and ratios to ``stock`` per round.
3. **Compile.** The model compiled whole against regionally (``HPUCompile(regional=True)``: the decoder blocks,
   which share one graph), each variant in a fresh process with an empty compile cache folder
   (``LIGHTNING_GAUDI_COMPILE_CACHE`` a new temporary directory: ``cold``), then in a second fresh process reusing
   that directory (``warm``): the first training step (compilation of forward and backward) and the mean of the
   later steps, in seconds; the graphs
   dynamo compiled (``unique_graphs``), the graphs the decoder block's ``forward`` holds
   (:func:`lightning_gaudi.callbacks.dynamo.cache_entries`) and inductor's FX-graph cache hits. ``whole_again``
   (whole, cold, its own empty cache) is the A/A control of the cold compile time. Backend ``inductor``
   (``--backend aot_eager`` traces without generating code: the graph counts hold, the times and the cache do not).
4. **Lazy host syncs** (``LIGHTNING_GAUDI_EMULATE=lazy``): ``stock`` (a ``MarkStep`` callback and Lightning's own
   logging and progress bar), ``stock_again`` (A/A) and ``plugin`` (the
   defaults), no logger; host syncs and mark_steps per step, graph compilations after warm-up and CPU fallbacks per
   step from the seam's ``lazy_counters()``, and speed. A model that Lazy Tensor Core cannot run is reported with
   its error.

Method as in the suite (``benchmarks/README.md``): one torch thread per process; medians with the (min-max) spread;
ratios per repetition on steps per CPU-second (the host is shared), wall-clock beside them; the machine recorded.
Writes ``hf_models.json`` and ``hf_models.md`` to ``--out`` (default ``benchmarks/results``; ``--quick``:
``benchmarks/out``) and prints the tables. ``--quick`` is a smoke run (a few steps, ``aot_eager``, one round, GPT-2
only in tables 2 and 3); its numbers mean nothing.

A fresh process runs ``python -m benchmarks.hf_models --worker ddp|compile VARIANT MODEL STEPS WARMUP OUT.json``
(the compile worker times the first step apart: its WARMUP is 1).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_gaudi  # noqa: F401 - registers the "hpu" accelerator and strategies
from benchmarks.common import (
    StepTimer,
    child_env,
    emulation,
    fmt_summary,
    log,
    machine,
    machine_line,
    parameter_count,
    quiet,
    ratio_summary,
    rotation,
    run_worker,
    summarize,
    trainer_kwargs,
)
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV

HERE = Path(__file__).resolve().parent
SEQ, BATCH, VOCAB = 64, 8, 512
#: The transformers config class and its arguments, per model.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", dict(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ)),
    "llama": (
        "LlamaConfig",
        dict(
            num_hidden_layers=2,
            hidden_size=128,
            intermediate_size=352,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        ),
    ),
}
#: Token ids the configs name outside the small vocabulary (GPT-2's 50256) are set to 0.
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")
MODEL_CLASSES = {"GPT2Config": "GPT2LMHeadModel", "LlamaConfig": "LlamaForCausalLM"}
OVERHEAD_VARIANTS = ("stock", "stock_again", "plugin")


@dataclass(frozen=True)
class Settings:
    """How long each table runs: the full run (the defaults) is sized for about 8 minutes on 2 quiet cores,
    :meth:`quick` for under a minute. Steps are per fit; the timed window starts after the warm-up steps."""

    models: tuple[str, ...] = ("gpt2", "llama")
    overhead_steps: int = 80
    overhead_warmup: int = 10
    overhead_repetitions: int = 5
    ddp_models: tuple[str, ...] = ("gpt2", "llama")
    ddp_steps: int = 100
    ddp_warmup: int = 15
    ddp_rounds: int = 3
    compile_models: tuple[str, ...] = ("gpt2", "llama")
    compile_variants: tuple[str, ...] = ("whole", "regional", "whole_again")
    compile_steps: int = 8
    lazy_steps: int = 42  # a window of 31 steps: the window closes at the start of the last batch
    lazy_warmup: int = 10
    lazy_repetitions: int = 3

    @classmethod
    def quick(cls) -> Settings:
        """A smoke run: a few steps, one round, GPT-2 alone in the tables that start processes, no compile A/A."""
        return cls(
            overhead_steps=6,
            overhead_warmup=2,
            overhead_repetitions=1,
            ddp_models=("gpt2",),
            ddp_steps=6,
            ddp_warmup=2,
            ddp_rounds=1,
            compile_models=("gpt2",),
            compile_variants=("whole", "regional"),
            compile_steps=3,
            lazy_steps=7,
            lazy_warmup=3,
            lazy_repetitions=1,
        )


# ---------------------------------------------------------------- the model, its data, the trainer


def build(name: str) -> nn.Module:
    """The Hugging Face model ``name`` of :data:`CONFIGS`, randomly initialised (seeded by the caller)."""
    import transformers

    transformers.logging.set_verbosity_error()
    config_class, arguments = CONFIGS[name]
    config = getattr(transformers, config_class)(**arguments)
    for key in SPECIAL_TOKENS:
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= VOCAB:
            setattr(config, key, 0)
    return getattr(transformers, MODEL_CLASSES[config_class])(config)  # type: ignore[no-any-return]


class CausalLM(LightningModule):
    """A Hugging Face causal LM trained on its own input ids; AdamW; the loss on the progress bar every step."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.model = build(name)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        (ids,) = batch
        loss: Tensor = self.model(input_ids=ids, labels=ids).loss
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def tokens(steps: int, processes: int = 1, seed: int = 0) -> DataLoader:
    """``steps`` batches per process of random token ids, fixed shapes."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (steps * processes * BATCH, SEQ), generator=generator)
    return DataLoader(TensorDataset(ids), batch_size=BATCH, drop_last=True)


def _trainer(steps: int, callbacks: list[Callback], logdir: str | None, **kwargs: Any) -> Trainer:
    """Lightning's defaults but checkpoints and the model summary; a CSV logger in ``logdir`` (``None``: none)."""
    logger = CSVLogger(logdir, name="", version="") if logdir is not None else False
    return Trainer(**trainer_kwargs(steps, callbacks=callbacks, logger=logger, **kwargs))


def _quiet_libraries() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "torch._dynamo", "torch._inductor"):
        logging.getLogger(name).setLevel(logging.ERROR)


# ---------------------------------------------------------------- 1. overhead, 1 process


def _fit_overhead(name: str, variant: str, steps: int, warmup: int) -> tuple[float, float]:
    stock = variant.startswith("stock")
    with tempfile.TemporaryDirectory() as logdir, emulation(None if stock else "eager"):
        seed_everything(0, verbose=False)
        timer = StepTimer(warmup, steps - 1)
        if not stock:
            from lightning_gaudi import hpu

            timer.synchronize = hpu.get_backend().synchronize
        trainer = _trainer(steps, [timer], logdir, accelerator="cpu" if stock else "hpu")
        with quiet():
            trainer.fit(CausalLM(name), tokens(steps))
    return timer.steps_per_second(), timer.steps_per_cpu_second()


def overhead(settings: Settings) -> dict[str, Any]:
    """Table 1: stock, stock_again and plugin in this process, rotating order, per model."""
    wall, cpu = _per_variant(settings.models), _per_variant(settings.models)
    for repetition in range(settings.overhead_repetitions):
        for name in settings.models:
            for variant in rotation(OVERHEAD_VARIANTS, repetition):
                per_wall, per_cpu = _fit_overhead(name, variant, settings.overhead_steps, settings.overhead_warmup)
                wall[name][variant].append(per_wall)
                cpu[name][variant].append(per_cpu)
                log(f"  overhead rep {repetition + 1} {name} {variant:>11}: {_speed(per_cpu, per_wall)}")
    return {
        "steps": settings.overhead_steps,
        "warmup_steps": settings.overhead_warmup,
        "repetitions": settings.overhead_repetitions,
        "models": {name: _speed_table(cpu[name], wall[name]) for name in settings.models},
    }


def _per_variant(models: tuple[str, ...]) -> dict[str, dict[str, list[float]]]:
    """Empty lists of measurements per model and variant."""
    return {name: {variant: [] for variant in OVERHEAD_VARIANTS} for name in models}


def _speed(per_cpu: float, per_wall: float) -> str:
    return f"{per_cpu:6.1f} steps/CPU-s, {per_wall:6.1f} steps/s"


def _speed_table(cpu: dict[str, list[float]], wall: dict[str, list[float]]) -> dict[str, Any]:
    """Summaries per variant and the per-repetition ratios to ``stock``, CPU time and wall clock."""
    others = [v for v in cpu if v != "stock"]
    return {
        "steps_per_cpu_s": {v: summarize(values) for v, values in cpu.items()},
        "steps_per_s": {v: summarize(values) for v, values in wall.items()},
        "vs_stock": {v: ratio_summary(cpu[v], cpu["stock"]) for v in others},
        "vs_stock_wall": {v: ratio_summary(wall[v], wall["stock"]) for v in others},
    }


# ---------------------------------------------------------------- 2. overhead, 2 processes (fresh pairs)


def ddp_worker(variant: str, name: str, steps: int, warmup: int, out: Path) -> None:
    """One fit on 2 processes; rank 0 writes its steps/s. Run by :func:`ddp` through ``--worker ddp``."""
    torch.set_num_threads(1)
    _quiet_libraries()
    stock = variant.startswith("stock")
    seed_everything(0, verbose=False)
    timer = StepTimer(warmup, steps - 1)
    accelerator, strategy = ("cpu", "ddp") if stock else ("hpu", "hpu_parallel")
    with tempfile.TemporaryDirectory() as logdir:
        trainer = _trainer(steps, [timer], logdir, devices=2, accelerator=accelerator, strategy=strategy)
        with quiet():
            trainer.fit(CausalLM(name), tokens(steps, processes=2))
    if trainer.global_rank == 0:
        speed = {"steps_per_s": timer.steps_per_second(), "steps_per_cpu_s": timer.steps_per_cpu_second()}
        out.write_text(json.dumps(speed))


def ddp(settings: Settings, scratch: Path) -> dict[str, Any]:
    """Table 2: stock DDP, stock_again and hpu_parallel, each a fresh pair of processes, rotating order."""
    wall, cpu = _per_variant(settings.ddp_models), _per_variant(settings.ddp_models)
    for index in range(settings.ddp_rounds):
        for name in settings.ddp_models:
            for variant in rotation(OVERHEAD_VARIANTS, index):
                env = child_env() if variant.startswith("stock") else child_env(LIGHTNING_GAUDI_EMULATE="eager")
                result = scratch / f"ddp-{variant}-{name}.json"
                args = ["ddp", variant, name, str(settings.ddp_steps), str(settings.ddp_warmup), str(result)]
                value = run_worker("benchmarks.hf_models", args, result, env)
                wall[name][variant].append(value["steps_per_s"])
                cpu[name][variant].append(value["steps_per_cpu_s"])
                speed = _speed(value["steps_per_cpu_s"], value["steps_per_s"])
                log(f"  ddp round {index + 1} {name} {variant:>11}: {speed}")
    return {
        "steps": settings.ddp_steps,
        "warmup_steps": settings.ddp_warmup,
        "rounds": settings.ddp_rounds,
        "models": {name: _speed_table(cpu[name], wall[name]) for name in settings.ddp_models},
        "left_out": [name for name in settings.models if name not in settings.ddp_models],
    }


# ---------------------------------------------------------------- 3. compile: whole against regional, cold and warm


class StepSeconds(Callback):
    """Wall-clock seconds of every training step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def compile_worker(variant: str, name: str, steps: int, out: Path) -> None:
    """One compiled fit in this (fresh) process. Run by :func:`compile_table` through ``--worker compile``."""
    from torch._dynamo.utils import counters

    from lightning_gaudi.callbacks import HPUCompile, dynamo

    torch.set_num_threads(1)
    _quiet_libraries()
    seed_everything(0, verbose=False)
    module, seconds = CausalLM(name), StepSeconds()
    block = next(type(m[0]) for m in module.modules() if isinstance(m, nn.ModuleList) and len(m))
    trainer = _trainer(steps, [HPUCompile(regional=variant == "regional"), seconds], None, accelerator="hpu")
    with quiet():
        trainer.fit(module, tokens(steps))
    result = {
        "first_step_s": seconds.seconds[0],
        "later_step_s": sum(seconds.seconds[1:]) / max(1, len(seconds.seconds) - 1),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "block": block.__name__,
        "block_graphs": dynamo.cache_entries(block.forward),
        "fx_cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
    }
    out.write_text(json.dumps(result))


def compile_table(settings: Settings, backend: str, scratch: Path) -> dict[str, Any]:
    """Table 3: per model and variant, a cold process on an empty inductor cache, then a warm one on that cache."""
    runs: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in settings.compile_models}
    for index, name in enumerate(settings.compile_models):
        for variant in rotation(settings.compile_variants, index):
            phases = ("cold",) if variant.endswith("_again") else ("cold", "warm")
            with tempfile.TemporaryDirectory(prefix="hf_inductor_") as cache:
                env = child_env(LIGHTNING_GAUDI_EMULATE="eager", LIGHTNING_GAUDI_COMPILE_CACHE=cache)
                env[COMPILE_BACKEND_ENV] = backend
                for phase in phases:
                    result = scratch / f"compile-{variant}-{name}.json"
                    args = ["compile", variant, name, str(settings.compile_steps), "1", str(result)]
                    run = run_worker("benchmarks.hf_models", args, result, env, timeout=900)
                    runs[name][f"{variant} {phase}"] = run
                    log(
                        f"  compile {name} {variant:>11} {phase}: first step {run['first_step_s']:.2f} s,"
                        f" later {run['later_step_s']:.4f} s, {run['graphs']} graphs"
                    )
    return {"backend": backend, "steps": settings.compile_steps, "models": runs}


# ---------------------------------------------------------------- 4. lazy host syncs


def _fit_lazy(name: str, variant: str, steps: int, warmup: int) -> dict[str, Any]:
    from lightning_gaudi.callbacks import MarkStep

    seed_everything(0, verbose=False)
    window = LazyWindow(warmup, steps - 2)  # closes at the start of the last batch
    stock = variant.startswith("stock")
    callbacks: list[Callback] = [MarkStep(), window] if stock else [window]
    with _stock_logging() if stock else contextlib.nullcontext(), quiet():
        _trainer(steps, callbacks, None, accelerator="hpu").fit(CausalLM(name), tokens(steps))
    return window.result()


def _failure(error: BaseException) -> str:
    """The error in one line, and the innermost line of transformers' code it came through."""
    message = (str(error).splitlines() or [""])[0]
    failure = f"{type(error).__name__}: {message if len(message) <= 160 else message[:157] + '...'}"
    package = f"{os.sep}transformers{os.sep}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if package in frame.filename]
    if frames:
        failure += f" (at transformers/{frames[-1].filename.rpartition(package)[2]}:{frames[-1].lineno})"
    return failure


def lazy(settings: Settings) -> dict[str, Any]:
    """Table 4: stock + MarkStep, stock_again and plugin under lazy emulation, rotating order, per model."""
    measured: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {v: [] for v in OVERHEAD_VARIANTS} for name in settings.models
    }
    failed: dict[str, str] = {}
    with emulation("lazy"):
        for repetition in range(settings.lazy_repetitions):
            for name in settings.models:
                for variant in rotation(OVERHEAD_VARIANTS, repetition):
                    if name in failed:
                        continue
                    try:
                        result = _fit_lazy(name, variant, settings.lazy_steps, settings.lazy_warmup)
                    except RuntimeError as error:
                        failed[name] = _failure(error)
                        log(f"  lazy {name}: does not run under Lazy Tensor Core ({failed[name]})")
                        continue
                    measured[name][variant].append(result)
                    log(
                        f"  lazy rep {repetition + 1} {name} {variant:>11}: {result['host_syncs_per_step']:.3f}"
                        f" syncs/step, {result['compilations_after_warmup']} compilations after warm-up,"
                        f" {_speed(result['steps_per_cpu_s'], result['steps_per_s'])}"
                    )
    models: dict[str, Any] = {}
    for name, variants in measured.items():
        if name in failed:
            models[name] = {"error": failed[name]}
            continue
        counts = ("host_syncs_per_step", "mark_steps_per_step", "compilations_after_warmup", "cpu_fallbacks_per_step")
        cpu = {v: [r["steps_per_cpu_s"] for r in results] for v, results in variants.items()}
        wall = {v: [r["steps_per_s"] for r in results] for v, results in variants.items()}
        models[name] = {
            **_speed_table(cpu, wall),
            # the worst repetition of each count
            "counts": {v: {key: max(r[key] for r in results) for key in counts} for v, results in variants.items()},
            "cpu_fallback_ops": sorted({op for rs in variants.values() for r in rs for op in r["cpu_fallback_ops"]}),
        }
    return {
        "steps": settings.lazy_steps,
        "warmup_steps": settings.lazy_warmup,
        "window_steps": settings.lazy_steps - 1 - settings.lazy_warmup,
        "repetitions": settings.lazy_repetitions,
        "models": models,
    }


# ---------------------------------------------------------------- the tables


def table(results: dict[str, Any]) -> str:
    """The four tables as markdown, headed by the machine."""
    sizes = ", ".join(f"{name} {count / 1e6:.2f}M parameters" for name, count in results["parameters"].items())
    lines = [
        f"Hugging Face models, random init ({sizes}); batches of {BATCH} x {SEQ} tokens; AdamW."
        + (" Quick run: the numbers mean nothing." if results["quick"] else ""),
        f"Machine: {machine_line(results['machine'])}. The run took {results['seconds']:.0f} s.",
        "",
    ]
    if "overhead" in results:
        one = results["overhead"]
        caption = f"1. Overhead, 1 process: {one['steps']} steps ({one['warmup_steps']} warm-up)"
        lines += _speed_lines(f"{caption}, {_count(one['repetitions'], 'repetition')}", one["models"])
    if "ddp" in results:
        two = results["ddp"]
        caption = f"2. Overhead, 2 processes (DDP): {two['steps']} steps ({two['warmup_steps']} warm-up)"
        caption += f", {_count(two['rounds'], 'round')} of fresh process pairs"
        if two["left_out"]:
            caption += f"; {', '.join(two['left_out'])} left out (time)"
        lines += _speed_lines(caption, two["models"])
    if "compile" in results:
        lines += _compile_lines(results["compile"])
    if "lazy" in results:
        lines += _lazy_lines(results["lazy"])
    return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _speed_lines(caption: str, models: dict[str, Any]) -> list[str]:
    lines = [
        f"{caption}. `stock_again` is the A/A control.",
        "",
        "| model | variant | steps per CPU-second | steps per wall-second | vs stock, CPU time | vs stock, wall |",
        "|---|---|---|---|---|---|",
    ]
    for name, speed in models.items():
        for variant, cpu in speed["steps_per_cpu_s"].items():
            ratio, ratio_wall = speed["vs_stock"].get(variant), speed["vs_stock_wall"].get(variant)
            versus = (fmt_summary(ratio, ".3f"), fmt_summary(ratio_wall, ".3f")) if ratio else ("1", "1")
            wall = fmt_summary(speed["steps_per_s"][variant])
            lines.append(f"| {name} | `{variant}` | {fmt_summary(cpu)} | {wall} | {versus[0]} | {versus[1]} |")
    return [*lines, ""]


def _compile_lines(compiled: dict[str, Any]) -> list[str]:
    caption = (
        f"3. Compile, backend {compiled['backend']}, {compiled['steps']} steps per process; each variant cold (a fresh"
        " process, an empty inductor cache) then warm (a second fresh process on that cache)"
    )
    if compiled["backend"] != "inductor":
        caption += f" ({compiled['backend']} generates no code: nothing is cached)"
    if any("whole_again cold" in runs for runs in compiled["models"].values()):
        caption += ". `whole_again` (cold only) is the A/A control"
    lines = [
        caption + ".",
        "",
        "| model | variant | first step s | later steps s (mean) | graphs compiled | graphs of the block's forward | FX cache hits |",  # noqa: E501
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in compiled["models"].items():
        for key, run in runs.items():
            lines.append(
                f"| {name} | `{key}` | {run['first_step_s']:.2f} | {run['later_step_s']:.4f} | {run['graphs']}"
                f" | {run['block_graphs']} ({run['block']}) | {run['fx_cache_hits']} |"
            )
    return [*lines, ""]


def _lazy_lines(lazy_results: dict[str, Any]) -> list[str]:
    lines = [
        f"4. Lazy mode: {lazy_results['window_steps']} steps after {lazy_results['warmup_steps']} warm-up,"
        f" {_count(lazy_results['repetitions'], 'repetition')}, no logger; counts are the worst repetition."
        " `stock` is stock Lightning with a `MarkStep` callback; `stock_again` is the A/A control.",
        "",
        "| model | variant | host syncs per step | graph compilations after warm-up | mark_steps per step | CPU fallbacks per step | steps per CPU-second | vs stock, CPU time |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, result in lazy_results["models"].items():
        if "error" in result:
            lines.append(f"| {name} | all | does not run under Lazy Tensor Core: {result['error']} | | | | | |")
            continue
        for variant, counts in result["counts"].items():
            ratio = result["vs_stock"].get(variant)
            speed = fmt_summary(result["steps_per_cpu_s"][variant])
            lines.append(
                f"| {name} | `{variant}` | {counts['host_syncs_per_step']:.3f} | {counts['compilations_after_warmup']}"
                f" | {counts['mark_steps_per_step']:.2f} | {counts['cpu_fallbacks_per_step']:.1f}"
                f" | {speed} | {fmt_summary(ratio, '.3f') if ratio else '1'} |"
            )
        if result["cpu_fallback_ops"]:
            lines.append(f"| {name} | | CPU fallback ops: {', '.join(result['cpu_fallback_ops'])} | | | | | |")
    return [*lines, ""]


# ---------------------------------------------------------------- the run


TABLES = ("overhead", "ddp", "compile", "lazy")


def run(quick: bool, backend: str, out: Path, only: tuple[str, ...] = TABLES) -> dict[str, Any]:
    torch.set_num_threads(1)  # one emulated card per core
    _quiet_libraries()
    settings = Settings.quick() if quick else Settings()
    started = time.perf_counter()
    facts = machine()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hf_models_") as scratch:
        results: dict[str, Any] = {
            "quick": quick,
            "command": " ".join(["python -m benchmarks.hf_models", *sys.argv[1:]]),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": facts,
            "configs": {name: {"class": config[0], **config[1]} for name, config in CONFIGS.items()},
            "parameters": {name: parameter_count(build(name)) for name in settings.models},
            "batch": BATCH,
            "seq": SEQ,
            "settings": asdict(settings),
            "section_seconds": {},
        }
        tables: dict[str, Callable[[], dict[str, Any]]] = {
            "overhead": lambda: overhead(settings),
            "ddp": lambda: ddp(settings, Path(scratch)),
            "compile": lambda: compile_table(settings, backend, Path(scratch)),
            "lazy": lambda: lazy(settings),
        }
        for section, measure in tables.items():
            if section not in only:
                continue
            begin = time.perf_counter()
            results[section] = measure()
            results["section_seconds"][section] = time.perf_counter() - begin
    results["seconds"] = time.perf_counter() - started
    results["load_average_at_end"] = machine()["load_average_1min"]
    (out / "hf_models.json").write_text(json.dumps(results, indent=2))
    (out / "hf_models.md").write_text(table(results) + "\n")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_models", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (under a minute); its numbers mean nothing")
    parser.add_argument("--backend", default=None, help="compile backend: inductor (default), aot_eager (--quick)")
    parser.add_argument("--out", type=Path, default=None, help="where hf_models.json and .md go")
    parser.add_argument("--only", default=",".join(TABLES), help="comma-separated tables (default: all four)")
    worker = ("KIND", "VARIANT", "MODEL", "STEPS", "WARMUP", "OUT")
    parser.add_argument("--worker", nargs=len(worker), metavar=worker, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, variant, name, steps, warmup, result = args.worker
        if kind == "ddp":
            ddp_worker(variant, name, int(steps), int(warmup), Path(result))
        elif kind == "compile":
            compile_worker(variant, name, int(steps), Path(result))
        else:
            parser.error(f"--worker {kind!r}: the kinds are ddp and compile")
        return
    backend = args.backend or ("aot_eager" if args.quick else "inductor")
    out = args.out or HERE / ("out" if args.quick else "results")
    only = tuple(name.strip() for name in args.only.split(",") if name.strip())
    if not only or set(only) - set(TABLES):
        parser.error(f"--only {args.only!r}: choose tables from {', '.join(TABLES)}")
    print(table(run(args.quick, backend, out, only)))
    log(f"wrote {out / 'hf_models.json'} and hf_models.md")


if __name__ == "__main__":
    main()


class LazyWindow(Callback):
    """Lazy counters and time over training batches ``warmup`` .. ``last`` (inclusive), every callback included.

    Read at the start of batch ``warmup`` and at the start of batch ``last + 1`` (so the fit needs one more batch):
    whatever any callback does at the end of batch ``last`` (the progress bar refreshing) falls inside the window.
    """

    def __init__(self, warmup: int, last: int) -> None:
        from lightning_gaudi import hpu

        self.backend = hpu.get_backend()
        self.warmup = warmup
        self.last = last
        self.begin: Any = None
        self.end: Any = None
        self.start_time = self.end_time = self.start_cpu = self.end_cpu = 0.0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.backend.synchronize()
            self.begin = self.backend.lazy_counters()
            self.start_time, self.start_cpu = time.perf_counter(), time.process_time()

        if batch_idx == self.last + 1:
            self.backend.synchronize()
            self.end_time, self.end_cpu = time.perf_counter(), time.process_time()
            self.end = self.backend.lazy_counters()

    def result(self) -> dict[str, Any]:
        if self.begin is None or self.end is None:
            raise RuntimeError(f"the lazy window never closed (warmup={self.warmup}, last={self.last})")
        steps = self.last - self.warmup + 1

        def per_step(name: str) -> float | None:  # the real bridge cannot count host syncs and mark_steps
            end, begin = getattr(self.end, name), getattr(self.begin, name)
            return None if end is None or begin is None else (end - begin) / steps

        fallbacks = {
            op: count - self.begin.cpu_fallbacks.get(op, 0)
            for op, count in self.end.cpu_fallbacks.items()
            if count - self.begin.cpu_fallbacks.get(op, 0)
        }
        return {
            "steps": steps,
            "steps_per_s": steps / (self.end_time - self.start_time),
            "steps_per_cpu_s": steps / (self.end_cpu - self.start_cpu),
            "compilations_after_warmup": self.end.graph_compilations - self.begin.graph_compilations,
            "host_syncs_per_step": per_step("host_syncs"),
            "mark_steps_per_step": per_step("mark_steps"),
            "cpu_fallbacks_per_step": sum(fallbacks.values()) / steps,
            "cpu_fallback_ops": sorted(fallbacks),
        }


@contextlib.contextmanager
def _stock_logging() -> Iterator[None]:
    """The plugin's logging wrappers stand aside: Lightning's own per-step behaviour (as in the plugin's tests)."""
    from lightning_gaudi.patches import sync_free_logging

    on_hpu = sync_free_logging._on_hpu
    sync_free_logging._on_hpu = lambda trainer: False  # type: ignore[assignment]
    try:
        yield
    finally:
        sync_free_logging._on_hpu = on_hpu
