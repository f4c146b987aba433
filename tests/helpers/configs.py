"""Composing the Hydra recipes under conf/ in tests."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_train(overrides: list[str], output_dir: Path | None = None, hydra: bool = False) -> DictConfig:
    """``conf/train.yaml`` with ``overrides``; ``output_dir`` stands in for Hydra's run dir outside a Hydra run."""
    extra = [] if output_dir is None else [f"paths.output_dir={output_dir}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*overrides, *extra], return_hydra_config=hydra)
