"""One process per card for each Hydra job, so that a multirun and DDP work together (Lightning's popen launcher would
re-run the whole sweep in every rank)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from hydra.utils import get_class
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
from omegaconf import DictConfig, OmegaConf

from lightning_gaudi.app.hydra.prepare import local_world_size, prepare
from lightning_gaudi.distributed.environment import LaunchEnvironment
from lightning_gaudi.distributed.launcher import launch_local_ranks

RANK_CONFIG_FILE = "rank_config.yaml"
RANK_RESULTS_FILE = "rank_results.json"
#: The sections a rank config must have.
RANK_CONFIG_KEYS = ("trainer", "strategy", "runtime")

#: A job's work: trains on the composed config and returns its results (JSON-able values are sent back to the sweep).
Task = Callable[[DictConfig], Mapping[str, Any] | None]


def needs_rank_launch(cfg: DictConfig) -> bool:
    """Whether the job must start its ranks: a DDP, FSDP or model-parallel strategy on several cards, no launcher."""
    target = cfg.strategy.get("_target_") if isinstance(cfg.strategy, DictConfig) else None
    if target is None or not issubclass(get_class(target), (DDPStrategy, FSDPStrategy, ModelParallelStrategy)):
        return False
    if cfg.strategy.get("start_method", "popen") != "popen" or LaunchEnvironment.from_env().externally_launched:
        return False
    return local_world_size(cfg) > 1 or cfg.trainer.get("num_nodes", 1) > 1


def task_reference(task: Task) -> tuple[str, Path]:
    """``"module:function"`` for ``task`` and the folder of its module; ``ValueError`` if not importable."""
    module_name = getattr(task, "__module__", None)
    qualname = getattr(task, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    file = getattr(module, "__file__", None)
    if module is None or module_name == "__main__" or file is None or "<" in qualname or "." in qualname:
        raise ValueError(
            f"The task {task!r} must be a module-level function of an importable module (not of the script that"
            " runs Hydra), so that rank processes can import it. Move it to a module beside the script."
        )
    path = Path(file).resolve()
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)  # type: ignore[union-attr]
    return f"{module_name}:{qualname}", path.parents[depth]


def _import_task(reference: str) -> Task:
    module_name, _, name = reference.partition(":")
    if not module_name or not name:
        raise ValueError(f"{reference!r} is not a task reference of the form 'module:function'.")
    return cast(Task, getattr(importlib.import_module(module_name), name))


def launch_ranks(cfg: DictConfig, job_dir: Path, task: Task) -> dict[str, Any]:
    """Runs ``task`` in one process per local card on ``cfg`` (saved in ``job_dir``); returns rank zero's results."""
    reference, import_root = task_reference(task)
    nprocs = local_world_size(cfg)
    job_dir.mkdir(parents=True, exist_ok=True)
    config_path = job_dir / RANK_CONFIG_FILE
    results_path = job_dir / RANK_RESULTS_FILE
    results_path.unlink(missing_ok=True)
    config_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(import_root), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "lightning_gaudi.app.hydra", str(config_path), reference]
    codes = launch_local_ranks(command, nprocs, num_nodes=int(cfg.trainer.get("num_nodes", 1)), env=env)
    if any(codes):
        raise RuntimeError(
            f"Rank process(es) failed with exit codes {codes} (local ranks 0..{nprocs - 1}); see their output above."
        )
    return cast(dict[str, Any], json.loads(results_path.read_text())) if results_path.is_file() else {}


def load_rank_config(path: Path) -> DictConfig:
    """Reads a rank config written by :func:`launch_ranks` (``FileNotFoundError``, or ``ValueError`` if malformed)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"No rank config at {str(path)!r}; launch_ranks writes one per job ({RANK_CONFIG_FILE})."
        )
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # yaml's errors carry the line and column
        raise ValueError(f"{str(path)!r} is not valid YAML: {err}") from err
    missing = [key for key in RANK_CONFIG_KEYS if not isinstance(cfg, DictConfig) or key not in cfg]
    if not isinstance(cfg, DictConfig) or missing:
        raise ValueError(
            f"{str(path)!r} is not a training config: it lacks {missing or 'a mapping at the top level'}."
            " Pass the rank_config.yaml of a job folder."
        )
    return cfg


def main(argv: list[str]) -> int:
    """A rank process (``python -m lightning_gaudi.app.hydra CONFIG MODULE:FUNCTION``). Returns the exit code."""
    if len(argv) != 2:
        print("usage: python -m lightning_gaudi.app.hydra RANK_CONFIG.yaml MODULE:FUNCTION", file=sys.stderr)
        return 2
    config_path = Path(argv[0])
    try:
        cfg = load_rank_config(config_path)
        task = _import_task(argv[1])
    except (FileNotFoundError, ValueError, ImportError, AttributeError) as err:
        print(f"lightning_gaudi.app.hydra: {err}", file=sys.stderr)
        return 2
    prepare(cfg)
    results = task(cfg)
    if results is not None and LaunchEnvironment.from_env().is_global_zero:
        tmp = config_path.with_name(f".{RANK_RESULTS_FILE}.tmp")
        tmp.write_text(json.dumps(dict(results), indent=2, default=str) + "\n")
        tmp.replace(config_path.with_name(RANK_RESULTS_FILE))
    return 0
