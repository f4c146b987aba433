"""Hydra integration (schemas, ``lg.*`` resolvers, a rank launcher, registered on import); an app wraps :func:`run`::

@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg):
    return lightning_gaudi.app.hydra.run(cfg, my_recipe.train)  # train(cfg) -> results dict
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from lightning_gaudi.app.hydra.prepare import apply_runtime, check_launch, local_world_size, prepare
from lightning_gaudi.app.hydra.ranks import Task, launch_ranks, needs_rank_launch
from lightning_gaudi.app.hydra.resolvers import register_resolvers
from lightning_gaudi.app.hydra.schemas import SCHEMA_GROUP, check_slurm_launcher, register_schemas
from lightning_gaudi.fp8.inference import DEFAULT_STATS_PATH, check_fp8_inference
from lightning_gaudi.strategies.deepspeed import HPUDeepSpeedStrategy, gradient_clipping

__all__ = [
    "SCHEMA_GROUP",
    "Task",
    "apply_runtime",
    "check_before_launch",
    "check_evaluation",
    "check_launch",
    "check_slurm_launcher",
    "instantiate_group",
    "local_world_size",
    "needs_rank_launch",
    "objective",
    "prepare",
    "register",
    "run",
]


def register() -> None:
    """Registers the schemas in Hydra's ConfigStore and the ``lg.*`` resolvers with OmegaConf (idempotent)."""
    register_schemas()
    register_resolvers()


def instantiate_group(node: DictConfig | None) -> list[Any]:
    """Instantiates every ``_target_`` node of a ``name -> node`` group (callbacks, loggers); skips nulls."""
    if node is None:
        return []
    return [instantiate(item) for item in node.values() if isinstance(item, DictConfig) and "_target_" in item]


def objective(cfg: DictConfig, results: Mapping[str, Any]) -> float | None:
    """``cfg.optimized_metric`` from ``results`` (or ``results["metrics"]``) for sweepers, if there and finite."""
    metric = cfg.get("optimized_metric")
    if not metric:
        return None
    value = results.get(metric, results.get("metrics", {}).get(metric))
    return float(value) if value is not None and math.isfinite(float(value)) else None


def check_before_launch(cfg: DictConfig) -> None:
    """Builds the strategy and a Trainer of ``cfg`` (no logger, callbacks or data) so that what the ranks would refuse
    fails here, before any rank process starts."""
    strategy = instantiate(cfg.strategy)
    try:
        trainer = instantiate(cfg.trainer, strategy=strategy, logger=False, callbacks=[], enable_checkpointing=False)
    except InstantiationException as error:
        raise (error.__cause__ or error) from None  # the Trainer's own message, not Hydra's wrapping of it
    if isinstance(strategy, HPUDeepSpeedStrategy) and isinstance(strategy.config, dict):
        gradient_clipping(strategy.config, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)


def check_evaluation(cfg: DictConfig) -> None:
    """Refuses, before training, a ``test=true`` run whose ``FP8Inference`` would find no measurements."""
    if not cfg.get("test"):
        return
    for node in (cfg.get("callbacks") or {}).values():
        if isinstance(node, DictConfig) and str(node.get("_target_", "")).rpartition(".")[2] == "FP8Inference":
            check_fp8_inference(node.get("mode", "quantize"), node.get("stats_path", DEFAULT_STATS_PATH))


def run(cfg: DictConfig, task: Task) -> float | None:
    """Runs one Hydra job: :func:`prepare`, then ``task(cfg)`` here or in one process per card; returns the
    :func:`objective`. ``task`` must be a module-level function (rank processes import it by name)."""
    prepare(cfg)
    check_evaluation(cfg)
    if needs_rank_launch(cfg):
        check_before_launch(cfg)
        results: Mapping[str, Any] = launch_ranks(cfg, Path(cfg.paths.output_dir), task)
    else:
        results = task(cfg) or {}
    return objective(cfg, results)


register()
