"""FP8 inference for ``trainer.validate``, ``test`` and ``predict`` through Intel Neural Compressor."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_gaudi.fp8 import inference
from lightning_gaudi.fp8.inference import DEFAULT_STATS_PATH, check_fp8_inference, fp8_inference_mode


class FP8Inference(Callback):
    """Validate, test and predict in FP8 through Intel Neural Compressor, measured in a first run (``mode="measure"``,
    which writes the ranges to ``stats_path``) and quantized in later ones; the arguments are those of
    :func:`~lightning_gaudi.fp8.prepare_fp8_inference` (``options``: its ``**options``). The model changes in place
    for good: ``trainer.fit`` ignores the callback (with a warning) and refuses a model it prepared."""

    def __init__(
        self,
        mode: Literal["measure", "quantize"] = "quantize",
        stats_path: str = DEFAULT_STATS_PATH,
        blocklist: Sequence[str] = (),
        options: Mapping[str, Any] | None = None,
    ) -> None:
        check_fp8_inference(mode)
        self.mode, self.stats_path, self.blocklist = mode, os.fspath(stats_path), list(blocklist)
        self.options = dict(options or {})
        self._active = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._active = stage != "fit"
        if self._active:
            check_fp8_inference(self.mode, self.stats_path)
        elif (prepared := fp8_inference_mode(pl_module)) is not None:
            raise ValueError(
                f"{type(pl_module).__name__} was prepared for FP8 inference (mode {prepared!r}) and cannot train: its"
                " layers changed for good. Fit a freshly built model (load its weights)."
            )
        else:
            rank_zero_warn(
                "FP8Inference does nothing in trainer.fit: training and its validation run unquantized. It acts in"
                " trainer.validate, trainer.test and trainer.predict."
            )

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active:
            inference.prepare_fp8_inference(pl_module, self.mode, self.stats_path, self.blocklist, **self.options)

    def _end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active and self.mode == "measure":
            inference.finalize_fp8_calibration(pl_module)

    on_validation_start = on_test_start = on_predict_start = _start
    on_validation_end = on_test_end = on_predict_end = _end
