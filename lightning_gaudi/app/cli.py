"""The ``lightning-gaudi`` console script: Lightning's CLI with the HPU accelerator, strategies and runtime
(docs/recipes.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_gaudi  # registers "hpu" and the HPU strategies before the CLI builds a Trainer
from lightning_gaudi import resume
from lightning_gaudi.hpu.runtime import Runtime, configure

#: What the CLI changes from Lightning's Trainer defaults: the HPU, one card.
TRAINER_DEFAULTS: dict[str, Any] = {"accelerator": "hpu", "devices": 1}


class GaudiCLI(LightningCLI):
    """:class:`~lightning.pytorch.cli.LightningCLI` on the HPU in subclass mode, with ``--runtime.*`` and
    ``--ckpt_path auto|last`` (:mod:`lightning_gaudi.resume`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs["trainer_defaults"] = {**TRAINER_DEFAULTS, **kwargs.get("trainer_defaults", {})}
        super().__init__(L.LightningModule, L.LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(Runtime, "runtime", instantiate=False)

    def before_instantiate_classes(self) -> None:
        """Applies ``--runtime.*`` before the Trainer (and anything that loads the bridge) is built."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        settings = config.get("runtime")
        configure(Runtime(**(dict(settings) if settings else {})))

    def before_fit(self) -> None:
        """Resolves ``--ckpt_path auto|last`` (:mod:`lightning_gaudi.resume`) in the checkpoint callback's folder."""
        config = self.config_init["fit"]
        policy = config.get("ckpt_path")
        if policy in resume.POLICIES:
            config["ckpt_path"] = resume.resolve_in_checkpoint_dir(
                policy, self.trainer.checkpoint_callback, self.trainer.default_root_dir
            )


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lightning-gaudi``; modules in the working directory import by name, as under ``python -m``."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")
    GaudiCLI(args=args)


__all__ = ["TRAINER_DEFAULTS", "GaudiCLI", "lightning_gaudi", "main"]

if __name__ == "__main__":
    main()
