"""Hydra integration: typed schemas for the plugin's objects, run-folder resolvers, and a per-job rank launcher.

A Hydra app is a thin ``@hydra.main`` around :func:`run` and a task function of its own::

    import lightning_gaudi.hydra

    @hydra.main(config_path="conf", config_name="train", version_base="1.3")
    def main(cfg):
        return lightning_gaudi.hydra.run(cfg, my_recipe.train)  # train(cfg) -> results dict

:func:`run` applies ``cfg.runtime`` before anything loads the bridge, checks a SLURM launch, and then runs the task
in this process or, for a multi-card job that no launcher has started, in one process per card (see
:mod:`~lightning_gaudi.hydra.ranks`). Importing this module registers the schemas and the ``lg.*`` resolvers.
``import lightning_gaudi`` does not import Hydra; only this sub-package does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from lightning_gaudi.hydra.prepare import apply_runtime, check_launch, local_world_size, prepare
from lightning_gaudi.hydra.ranks import Task, launch_ranks, needs_rank_launch
from lightning_gaudi.hydra.resolvers import register_resolvers
from lightning_gaudi.hydra.schemas import SCHEMA_GROUP, check_slurm_launcher, register_schemas

__all__ = [
    "SCHEMA_GROUP",
    "Task",
    "apply_runtime",
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
    """``cfg.optimized_metric`` read from ``results`` (a top-level key or one of ``results["metrics"]``), for Hydra
    sweepers; ``None`` when the config names none or the value is missing or not finite."""
    metric = cfg.get("optimized_metric")
    if not metric:
        return None
    value = results.get(metric, results.get("metrics", {}).get(metric))
    return float(value) if value is not None and math.isfinite(float(value)) else None


def run(cfg: DictConfig, task: Task) -> float | None:
    """Runs one Hydra job: :func:`prepare`, then ``task(cfg)`` here or in one process per card.

    Args:
        cfg: the composed config; needs ``trainer``, ``strategy``, ``runtime`` and ``paths.output_dir``.
        task: a module-level function ``task(cfg) -> results`` (rank processes import it by name).

    Returns:
        :func:`objective` of the results.
    """
    prepare(cfg)
    if needs_rank_launch(cfg):
        instantiate(cfg.strategy)  # a bad strategy argument fails here, before any rank process starts
        results: Mapping[str, Any] = launch_ranks(cfg, Path(cfg.paths.output_dir), task)
    else:
        results = task(cfg) or {}
    return objective(cfg, results)


register()
