"""What the Hydra apps under ``examples/`` share: setup, training, local rank launching, and run-directory resolvers.

``examples/train.py`` is ``@hydra.main`` around :func:`main`. For a multi-card job on one machine, :func:`main`
starts the ranks itself (one process per card, each training on the job's fully resolved config saved in the job
directory) instead of letting Lightning's popen launcher re-run the script: that launcher re-runs ``sys.argv``, so
under ``-m`` every rank would re-parse and re-run the whole sweep. Each sweep point therefore gets its own process
group and its own results. Under torchrun, SLURM or any launcher that starts the ranks, every rank runs the app and
trains in its own process; the resolvers below make all ranks agree on one run directory and keep Hydra's own files
to rank zero.

Resolvers (registered on import):

- ``${lg.run_id:DEFAULT}``: an id shared by every rank of a launch (``LIGHTNING_GAUDI_RUN_ID``, the SLURM job and
  step, or torchrun's run id), else ``DEFAULT`` (e.g. ``${now:...}`` when one process runs the app);
- ``${lg.rank_zero:VALUE}``: ``VALUE`` on global rank zero, ``null`` on the other ranks;
- ``${lg.rank_suffix:}``: ``""`` on rank zero, ``"_rank<N>"`` elsewhere;
- ``${lg.on_gaudi:A,B}``: ``A`` with Intel's bridge (a real Gaudi), ``B`` under emulation (e.g. a precision that is
  fast on Gaudi but slow on a CPU without bfloat16 units).

Run a saved rank config by hand with ``python -m lightning_gaudi.app CONFIG.yaml`` (the launcher does this).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import lightning as L
from hydra.utils import get_class, instantiate
from lightning.fabric.plugins.environments import LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf

from lightning_gaudi import hpu, resume
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.callbacks import HPUThroughputMonitor
from lightning_gaudi.config import apply_emulation, register_configs

log = logging.getLogger(__name__)

RUN_ID_ENV = "LIGHTNING_GAUDI_RUN_ID"
RESULTS_FILE = "results.json"
RANK_CONFIG_FILE = "rank_config.yaml"
_GIB = 1024**3


# ---------------------------------------------------------------- resolvers


def shared_run_id(default: str) -> str:
    """An id that every rank of one launch computes alike, or ``default`` when no launcher started this process."""
    explicit = os.environ.get(RUN_ID_ENV)
    if explicit:
        return explicit
    if "SLURM_JOB_ID" in os.environ and "SLURM_PROCID" in os.environ:
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f"-{step}" if step is not None else "")
    if TorchElasticEnvironment.detect():
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        if run_id != "none":
            return f"torchrun-{run_id}"
        # static rendezvous (plain torchrun on one node): the ranks share the elastic agent, their parent process
        return f"torchrun-{os.environ.get('MASTER_PORT', '0')}-{os.getppid()}"
    return default


def is_global_rank_zero() -> bool:
    """Whether this process is global rank zero, judged from the launcher's environment (before any Trainer)."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return os.environ[key] == "0"
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def _global_rank() -> str:
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return os.environ[key]
    return f"{os.environ.get('NODE_RANK', '0')}.{os.environ.get('LOCAL_RANK', '0')}"


def _on_gaudi(on_gaudi: Any, emulated: Any) -> Any:
    return on_gaudi if hpu.emulation_mode() is None and hpu.bridge_installed() else emulated


def register_resolvers() -> None:
    """Registers the ``lg.*`` resolvers with OmegaConf (idempotent)."""
    resolvers: dict[str, Callable[..., Any]] = {
        "lg.run_id": shared_run_id,
        "lg.rank_zero": lambda value: value if is_global_rank_zero() else None,
        "lg.rank_suffix": lambda: "" if is_global_rank_zero() else f"_rank{_global_rank()}",
        "lg.on_gaudi": _on_gaudi,
    }
    for name, resolver in resolvers.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)


# ---------------------------------------------------------------- results


def _throughput_monitor(callbacks: list[Any], warmup_steps: int) -> HPUThroughputMonitor:
    """The configured throughput monitor, or a new one added to ``callbacks`` (results.json reports throughput)."""
    for callback in callbacks:
        if isinstance(callback, HPUThroughputMonitor):
            return callback
    monitor = HPUThroughputMonitor(warmup_steps=warmup_steps)
    callbacks.append(monitor)
    return monitor


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
    where = "this process's peak resident memory under emulation" if results["emulated"] else "MaxInUse"
    lines.append(f"peak memory (rank 0, {where}): {results['peak_memory_gib']:.3f} GiB")
    lines.append(f"outputs: {results['output_dir']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- training


def _instantiate_group(node: DictConfig | None) -> list[Any]:
    """Instantiates every ``_target_`` node of a ``name -> node`` group (callbacks, loggers); skips nulls."""
    if node is None:
        return []
    return [instantiate(item) for item in node.values() if isinstance(item, DictConfig) and "_target_" in item]


def resume_from(policy: str | None, callbacks: list[Any]) -> str | None:
    """The checkpoint ``Trainer.fit`` resumes from under ``policy`` (see :mod:`lightning_gaudi.resume`).

    ``"auto"`` and ``"last"`` look in the ``ModelCheckpoint`` callback's folder; with no such callback nothing is
    saved, so ``"auto"`` starts fresh.
    """
    checkpoint = next((c for c in callbacks if isinstance(c, ModelCheckpoint)), None)
    if checkpoint is None and policy == "auto":
        return None
    dirpath = checkpoint.dirpath if checkpoint is not None else None
    return resume.resolve_ckpt_path(policy, dirpath)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Instantiates the data, model, callbacks, loggers, strategy and Trainer of ``cfg``, and trains.

    Rank zero writes ``results.json`` to ``cfg.paths.output_dir`` and prints a summary.

    Returns:
        The run's results: metrics, throughput, peak memory and what ran.
    """
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    # callbacks first: some set bridge variables that must exist before anything loads the bridge
    callbacks = _instantiate_group(cfg.get("callbacks"))
    throughput = _throughput_monitor(callbacks, cfg.get("throughput_warmup_steps", 5))
    loggers = _instantiate_group(cfg.get("logger"))
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    strategy = instantiate(cfg.strategy)
    trainer: L.Trainer = instantiate(cfg.trainer, strategy=strategy, callbacks=callbacks, logger=loggers or False)
    trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from(cfg.get("ckpt_path"), callbacks))
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


# ---------------------------------------------------------------- launching ranks


def launched_externally() -> bool:
    """Whether a launcher (torchrun, SLURM's srun, LSF, or anything that sets ``LOCAL_RANK``) started this process."""
    if "LOCAL_RANK" in os.environ:
        return True
    return any(env.detect() for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment))


def local_world_size(cfg: DictConfig) -> int:
    """How many processes this machine runs for ``cfg``: the HPU count ``trainer.devices`` selects (1 elsewhere)."""
    accelerator = cfg.trainer.get("accelerator")
    if accelerator != "hpu" and not (accelerator in ("auto", None) and hpu.is_available()):
        return 1
    devices = cfg.trainer.get("devices", "auto")
    if OmegaConf.is_config(devices):
        devices = OmegaConf.to_container(devices)
    return len(HPUAccelerator.parse_devices(cast(Any, devices)))


def needs_rank_launch(cfg: DictConfig) -> bool:
    """Whether :func:`main` should start the ranks: a DDP-style strategy with start method popen, several cards,
    and no launcher that has already started them."""
    target = cfg.strategy.get("_target_") if isinstance(cfg.strategy, DictConfig) else None
    if target is None or not issubclass(get_class(target), DDPStrategy):
        return False
    if cfg.strategy.get("start_method", "popen") != "popen" or launched_externally():
        return False
    return local_world_size(cfg) > 1 or cfg.trainer.get("num_nodes", 1) > 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_ranks(cfg: DictConfig, job_dir: Path) -> dict[str, Any]:
    """Trains ``cfg`` with one process per local card, each running :func:`train` on the saved, resolved config.

    The ranks find each other through ``MASTER_ADDR``/``MASTER_PORT`` (a free local port unless set, as a multi-node
    run must) and get ``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE``, which Lightning's default cluster
    environment reads. If one rank fails, the others are stopped.

    Returns:
        Rank zero's results (``results.json``), or an empty dict on the other nodes.

    Raises:
        RuntimeError: a rank exited with an error.
    """
    nprocs = local_world_size(cfg)
    num_nodes = int(cfg.trainer.get("num_nodes", 1))
    if num_nodes > 1 and not {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK"} <= os.environ.keys():
        raise ValueError(
            f"trainer.num_nodes={num_nodes} without a cluster launcher: set MASTER_ADDR, MASTER_PORT and NODE_RANK on"
            " every node, or launch with torchrun or SLURM."
        )
    job_dir.mkdir(parents=True, exist_ok=True)
    config_path = job_dir / RANK_CONFIG_FILE
    config_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = dict(os.environ)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(_free_port()))
    env.setdefault("NODE_RANK", "0")
    env["WORLD_SIZE"] = str(nprocs * num_nodes)
    log.info("lightning_gaudi: starting %d rank process(es) for %s", nprocs, job_dir)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lightning_gaudi.app", str(config_path)], env={**env, "LOCAL_RANK": str(rank)}
        )
        for rank in range(nprocs)
    ]
    codes = _wait_all(procs)
    if any(codes):
        raise RuntimeError(
            f"Rank process(es) failed with exit codes {codes} (local ranks 0..{nprocs - 1}); see their output above."
        )
    results_path = Path(cfg.paths.output_dir) / RESULTS_FILE
    return json.loads(results_path.read_text()) if results_path.is_file() else {}


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Waits for every process; when one fails, terminates the rest (they would hang in a collective)."""
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return [int(c) for c in codes if c is not None]
            if any(c not in (None, 0) for c in codes):
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                return [p.wait() for p in procs]
            time.sleep(0.2)
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise


# ---------------------------------------------------------------- entry points


def setup(cfg: DictConfig) -> None:
    """Applies the emulation settings (before anything asks for an HPU) and checks a SLURM launch."""
    message = apply_emulation(cfg.emulation)
    if message and is_global_rank_zero():
        print(f"{message} (emulation.mode=off requires a Gaudi instead.)", flush=True)
    _check_slurm_tasks(cfg)


def _check_slurm_tasks(cfg: DictConfig) -> None:
    """Under srun, SLURM's tasks per node must be the card count Lightning expects (one task per card)."""
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE")
    if tasks is None or not SLURMEnvironment.detect():
        return
    devices = local_world_size(cfg)
    if tasks.isdigit() and int(tasks) != devices:
        raise ValueError(
            f"SLURM started {tasks} task(s) per node but trainer.devices selects {devices} card(s). Launch one task"
            f" per card (--ntasks-per-node={devices}, or hydra.launcher.tasks_per_node) or set trainer.devices={tasks}."
        )


def main(cfg: DictConfig) -> float | None:
    """The body of a Hydra training app: setup, then train here or in rank processes.

    Returns:
        ``cfg.optimized_metric``'s final value (for Hydra sweepers), when the config names one.
    """
    setup(cfg)
    results = launch_ranks(cfg, Path(cfg.paths.output_dir)) if needs_rank_launch(cfg) else train(cfg)
    metric = cfg.get("optimized_metric")
    if not metric:
        return None
    value = results.get(metric, results.get("metrics", {}).get(metric))
    return float(value) if value is not None and math.isfinite(float(value)) else None


def load_rank_config(path: Path) -> DictConfig:
    """Reads a rank config written by :func:`launch_ranks`.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a YAML mapping with the sections :func:`train` needs.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"No rank config at {str(path)!r}; launch_ranks writes one per job ({RANK_CONFIG_FILE})."
        )
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # yaml's errors carry the line and column
        raise ValueError(f"{str(path)!r} is not valid YAML: {err}") from err
    missing = [key for key in ("trainer", "strategy", "model", "data", "paths", "emulation") if key not in cfg]
    if not isinstance(cfg, DictConfig) or missing:
        raise ValueError(
            f"{str(path)!r} is not a training config: it lacks {missing or 'a mapping at the top level'}."
            " Pass the rank_config.yaml of a job folder."
        )
    return cfg


def _rank_main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lightning_gaudi.app RANK_CONFIG.yaml", file=sys.stderr)
        return 2
    try:
        cfg = load_rank_config(Path(argv[0]))
    except (FileNotFoundError, ValueError) as err:
        print(f"lightning_gaudi.app: {err}", file=sys.stderr)
        return 2
    setup(cfg)
    train(cfg)
    return 0


register_resolvers()
register_configs()

if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
