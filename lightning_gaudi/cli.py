"""The ``lightning-gaudi`` console script: Lightning's CLI with the HPU accelerator and strategies registered.

    lightning-gaudi fit                                         # the example GPT on the standard library's sources
    lightning-gaudi fit --trainer.max_steps 50 --data.batch_size 16
    lightning-gaudi fit --trainer.strategy hpu_parallel --trainer.devices 2
    lightning-gaudi fit --trainer.strategy lightning_gaudi.HPUParallelStrategy \\
        --trainer.strategy.bucket_cap_mb 100 --trainer.devices 2
    lightning-gaudi fit --trainer.callbacks+=lightning_gaudi.callbacks.MarkStep
    lightning-gaudi fit --print_config > run.yaml && lightning-gaudi fit --config run.yaml
    lightning-gaudi fit --ckpt_path auto --trainer.callbacks ModelCheckpoint --trainer.callbacks.dirpath ckpts
    lightning-gaudi validate|test|predict --ckpt_path CKPT

The accelerator defaults to ``hpu``. Without Intel's bridge and without ``LIGHTNING_GAUDI_EMULATE``, the HPU is
emulated on the CPU in eager mode, and the CLI says so. ``--model`` and ``--data`` take any LightningModule and
LightningDataModule by class path; without them it trains :class:`~lightning_gaudi.models.GPTLanguageModel` on
:class:`~lightning_gaudi.data.StdlibTextDataModule`.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_gaudi  # registers "hpu" and the HPU strategies before the CLI builds a Trainer
from lightning_gaudi import hpu, resume
from lightning_gaudi.config import EmulationConf, EmulationMode, apply_emulation

DEFAULT_MODEL = "lightning_gaudi.models.GPTLanguageModel"
DEFAULT_DATA = "lightning_gaudi.data.StdlibTextDataModule"

#: Trainer defaults for the example: one HPU (pass ``--trainer.devices 8`` for a Gaudi server), and host reads of
#: logged values every 10 steps, not every step.
TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "hpu",
    "devices": 1,
    "max_steps": 300,
    "val_check_interval": 100,
    "limit_val_batches": 20,
    "log_every_n_steps": 10,
    "gradient_clip_val": 1.0,
}


class GaudiCLI(LightningCLI):
    """:class:`~lightning.pytorch.cli.LightningCLI` with the example model and data as defaults.

    ``--model`` and ``--data`` accept any subclass of LightningModule and LightningDataModule (subclass mode);
    ``--data.seq_len`` is linked to ``--model.block_size`` when both are the examples'.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("seed_everything_default", 1234)
        kwargs["trainer_defaults"] = {**TRAINER_DEFAULTS, **kwargs.get("trainer_defaults", {})}
        super().__init__(L.LightningModule, L.LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}, "data": {"class_path": DEFAULT_DATA}})

    def before_fit(self) -> None:
        """Resolves ``--ckpt_path auto|last`` (see :mod:`lightning_gaudi.resume`) in the checkpoint callback's folder.

        ``auto`` resumes from the newest complete checkpoint there, or starts fresh when there is none (or when the
        folder is only decided at fit time, as with the default ``ModelCheckpoint``).
        """
        config = self.config_init["fit"]
        policy = config.get("ckpt_path")
        if policy not in resume.POLICIES:
            return
        checkpoint = self.trainer.checkpoint_callback
        dirpath = getattr(checkpoint, "dirpath", None)
        config["ckpt_path"] = (
            None if dirpath is None and policy == "auto" else resume.resolve_ckpt_path(policy, dirpath)
        )


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lightning-gaudi``; ``args`` defaults to ``sys.argv[1:]``."""
    message = apply_emulation(EmulationConf(mode=EmulationMode.auto))
    if message and hpu.emulation_mode() is not None:
        print(message, file=sys.stderr, flush=True)
    GaudiCLI(args=args)


__all__ = ["DEFAULT_DATA", "DEFAULT_MODEL", "GaudiCLI", "lightning_gaudi", "main"]

if __name__ == "__main__":
    main()
