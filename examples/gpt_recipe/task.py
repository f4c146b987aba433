"""The example's training task: build everything from the composed config, fit, and report.

``train(cfg)`` is what each process of a Hydra job runs (``lightning_gaudi.app.hydra.run`` calls it here or in one
process per card). Global rank zero writes ``results.json`` (metrics, throughput, peak memory, what ran) to
``cfg.paths.output_dir`` and prints a summary.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig

from gpt_recipe import logs
from lightning_gaudi import hpu, resume
from lightning_gaudi.app.hydra import instantiate_group
from lightning_gaudi.callbacks import HPUThroughputMonitor
from lightning_gaudi.profilers import HPUProfiler

RESULTS_FILE = "results.json"
_GIB = 1024**3


def _throughput_monitor(callbacks: list[Any], warmup_steps: int) -> HPUThroughputMonitor:
    """The configured throughput monitor, or a new one added to ``callbacks`` (results.json reports throughput)."""
    for callback in callbacks:
        if isinstance(callback, HPUThroughputMonitor):
            return callback
    monitor = HPUThroughputMonitor(warmup_steps=warmup_steps)
    callbacks.append(monitor)
    return monitor


def _without_lr_monitor(callbacks: list[Any]) -> list[Any]:
    """``callbacks`` less any LearningRateMonitor, which stops a run that has no logger to write to."""
    kept = [callback for callback in callbacks if not isinstance(callback, LearningRateMonitor)]
    if len(kept) < len(callbacks):
        rank_zero_info(
            "gpt_recipe: no logger (logger=none), so the LearningRateMonitor (callbacks.lr_monitor) is left out: it"
            " would have nowhere to write the learning rate."
        )
    return kept


def _loss_curve(trainer: L.Trainer, key: str = "train/loss", points: int = 6) -> list[tuple[int, float]]:
    """A few (step, value) points of ``key`` from the CSV log, to show the loss falling."""
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            path = Path(logger.log_dir) / "metrics.csv"
            if not path.is_file():
                return []
            with path.open() as handle:
                rows = [(int(r["step"]), float(r[key])) for r in csv.DictReader(handle) if r.get(key)]
            if len(rows) <= points:
                return rows
            picks = {round(i * (len(rows) - 1) / (points - 1)) for i in range(points)}
            return [rows[i] for i in sorted(picks)]
    return []


def _profiler(cfg: DictConfig) -> Any:
    """The ``profiler`` group's profiler, or ``None`` when the group is off.

    Raises:
        ValueError: both ``profiler`` and ``trainer.profiler`` are set.
    """
    node = cfg.get("profiler")
    if not node:
        return None
    if cfg.trainer.get("profiler") is not None:
        raise ValueError(
            f"trainer.profiler={cfg.trainer.profiler!r} and the profiler group ({node.get('_target_')}) are both set;"
            " the Trainer takes one profiler: drop `trainer.profiler` or choose `profiler=none`."
        )
    return instantiate(node)


def _profile(profiler: Any) -> dict[str, Any] | None:
    """An HPUProfiler's report of the fit and where its traces are, for results.json."""
    if not isinstance(profiler, HPUProfiler):
        return None
    return {**dataclasses.asdict(profiler.report), "trace_dir": str(profiler.dirpath)}


def _summary(results: dict[str, Any]) -> str:
    lines = ["", "=== lightning_gaudi run summary ==="]
    lines.append(
        f"device: {results['devices']} x {results['device_name']}"
        + (f" (EMULATED on the CPU, {results['backend']} mode)" if results["emulated"] else "")
        + f" | strategy {results['strategy']} | precision {results['precision']}"
    )
    curve = results.get("loss_curve") or []
    if curve:
        lines.append("train/loss: " + "  ->  ".join(f"{value:.3f} (step {step})" for step, value in curve))
    metrics = results["metrics"]
    shown = [f"{k} {metrics[k]:.4g}" for k in ("val/loss", "val/ppl", "test/loss") if k in metrics]
    if shown:
        lines.append("final: " + ", ".join(shown))
    if results.get("samples_per_sec") is not None:
        line = f"throughput: {results['samples_per_sec']:.1f} samples/s"
        if results.get("tokens_per_sec") is not None:
            line += f", {results['tokens_per_sec']:.0f} tokens/s"
        line += f" over {results['timed_steps']:.0f} steps after {results['warmup_steps']} warm-up batches"
        line += " (without validation and checkpointing)"
        lines.append(line + f", {results['world_size']} process(es)")
    profile = results.get("profile")
    if profile:
        lines.append(
            f"profile: {profile['steps']} steps, {profile['step_ms']:.2f} ms each, {profile['model_share']:.0%} in the"
            f" model, {profile['host_syncs']} host syncs; traces in {profile['trace_dir']} (TensorBoard or"
            " https://ui.perfetto.dev)"
        )
    where = "this process's peak resident memory under emulation" if results["emulated"] else "MaxInUse"
    lines.append(f"peak memory (rank 0, {where}): {results['peak_memory_gib']:.3f} GiB")
    lines.append(f"outputs: {results['output_dir']}")
    return "\n".join(lines)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Instantiates the data, model, callbacks, loggers, strategy and Trainer of ``cfg``, and trains.

    Rank zero writes ``results.json`` to ``cfg.paths.output_dir`` and prints a summary.

    Returns:
        The run's results: metrics, throughput, peak memory and what ran.
    """
    logs.setup()
    profiler = _profiler(cfg)
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    callbacks = instantiate_group(cfg.get("callbacks"))
    throughput = _throughput_monitor(callbacks, cfg.get("throughput_warmup_steps", 5))
    loggers = instantiate_group(cfg.get("logger"))
    if not loggers:
        callbacks = _without_lr_monitor(callbacks)
    # plain containers, not OmegaConf ones: the hyperparameters go into checkpoints, which load with weights_only
    datamodule = instantiate(cfg.data, _convert_="all")
    model = instantiate(cfg.model, _convert_="all")
    strategy = instantiate(cfg.strategy)
    # passed only when the group is on: a `trainer.profiler` (Lightning's "simple", ...) stays the Trainer's
    extra = {} if profiler is None else {"profiler": profiler}
    trainer: L.Trainer = instantiate(
        cfg.trainer, strategy=strategy, callbacks=callbacks, logger=loggers or False, **extra
    )
    checkpoint = next((c for c in callbacks if isinstance(c, ModelCheckpoint)), None)
    ckpt_path = resume.resolve_in_checkpoint_dir(cfg.get("ckpt_path"), checkpoint, trainer.default_root_dir)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    profile = _profile(profiler)  # the fit's, before a test run reports on its own steps
    if cfg.get("test"):
        trainer.test(model, datamodule=datamodule)

    backend = hpu.get_backend()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    summary = throughput.summary  # global over ranks
    samples_per_sec = summary.get("samples_per_sec")
    tokens_per_sec = summary.get("tokens_per_sec")
    seq_len = getattr(datamodule, "seq_len", None)
    if tokens_per_sec is None and samples_per_sec is not None and isinstance(seq_len, int):
        tokens_per_sec = samples_per_sec * seq_len
    results: dict[str, Any] = {
        "output_dir": str(cfg.paths.output_dir),
        "backend": backend.name,
        "emulated": backend.emulated,
        "device_name": backend.device_name(),
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "ddp_kwargs": {k: v for k, v in getattr(trainer.strategy, "ddp_kwargs", {}).items() if _jsonable(v)},
        "precision": str(trainer.precision),
        "global_step": trainer.global_step,
        "metrics": metrics,
        "warmup_steps": throughput.warmup_steps,
        "timed_steps": summary.get("steps"),
        "timed_seconds": summary.get("seconds"),
        "samples_per_sec": samples_per_sec,
        "tokens_per_sec": tokens_per_sec,
        "peak_memory_gib": backend.memory_stats()["MaxInUse"] / _GIB,
        "loss_curve": _loss_curve(trainer) if trainer.is_global_zero else [],
    }
    if profile is not None:
        results["profile"] = profile
    if trainer.is_global_zero:
        out = Path(cfg.paths.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{RESULTS_FILE}.tmp"
        tmp.write_text(json.dumps(results, indent=2) + "\n")
        tmp.replace(out / RESULTS_FILE)
        print(_summary(results), flush=True)
    return results


def _jsonable(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None
