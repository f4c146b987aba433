"""Precision on the HPU: what ``training_step`` sees for each setting, however the precision is given."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import HalfPrecision, Precision

from lightning_gaudi import HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu


def _fit(**trainer_args: Any) -> tuple[Trainer, dict[str, Any]]:
    trainer_args.setdefault("devices", 1)
    trainer = Trainer(accelerator="hpu", **trainer_kwargs(max_steps=1, **trainer_args))
    model = RegressionModel()
    trainer.fit(model)
    assert trainer.global_step == 1
    return trainer, model.seen


def test_bf16_mixed_autocasts_on_the_hpu_device_type(eager_hpu: hpu.Backend) -> None:
    trainer, seen = _fit(precision="bf16-mixed")
    assert isinstance(trainer.precision_plugin, HPUPrecision)
    assert trainer.precision_plugin.device == "cpu"  # eager emulation: CPU autocast, never CUDA
    assert seen["autocast_cpu"] is True
    assert seen["autocast_dtype"] == torch.bfloat16
    assert seen["hidden_dtype"] == torch.bfloat16
    assert seen["param_dtype"] == torch.float32


def test_bf16_true(eager_hpu: hpu.Backend) -> None:
    trainer, seen = _fit(precision="bf16-true")
    assert isinstance(trainer.precision_plugin, HalfPrecision)
    assert seen["param_dtype"] == torch.bfloat16
    assert seen["hidden_dtype"] == torch.bfloat16
    assert seen["autocast_cpu"] is False


def test_32_true(eager_hpu: hpu.Backend) -> None:
    trainer, seen = _fit(precision="32-true")
    assert type(trainer.precision_plugin) is Precision
    assert seen["param_dtype"] == torch.float32
    assert seen["hidden_dtype"] == torch.float32
    assert seen["autocast_cpu"] is False


def test_16_mixed_on_gaudi2(eager_hpu: hpu.Backend) -> None:
    trainer, seen = _fit(precision="16-mixed")
    assert isinstance(trainer.precision_plugin, HPUPrecision)
    assert trainer.precision_plugin.scaler is not None
    assert seen["autocast_dtype"] == torch.float16
    assert seen["hidden_dtype"] == torch.float16


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_fp16_on_first_generation_gaudi(clean_hpu_env: pytest.MonkeyPatch, precision: str) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    with pytest.raises(ValueError, match=r"needs float16, which first-generation Gaudi \(GAUDI\).*bf16-mixed"):
        Trainer(accelerator="hpu", devices=1, precision=precision)


def test_fp16_plugin_on_first_generation_gaudi(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    with pytest.raises(ValueError, match="first-generation Gaudi"):
        HPUPrecision("16-mixed")
    assert HPUPrecision("bf16-mixed").device == "cpu"


def test_precision_as_plugin(eager_hpu: hpu.Backend) -> None:
    plugin = HPUPrecision("bf16-mixed")
    trainer, seen = _fit(plugins=[plugin])
    assert trainer.precision_plugin is plugin
    assert seen["autocast_dtype"] == torch.bfloat16
    assert seen["hidden_dtype"] == torch.bfloat16


def test_precision_through_the_strategy(eager_hpu: hpu.Backend) -> None:
    plugin = HPUPrecision("bf16-mixed")
    trainer, seen = _fit(strategy=SingleHPUStrategy(precision_plugin=plugin))
    assert trainer.precision_plugin is plugin
    assert seen["hidden_dtype"] == torch.bfloat16


def test_precision_through_the_parallel_strategy(eager_hpu: hpu.Backend) -> None:
    plugin = HPUPrecision("bf16-mixed")
    trainer = Trainer(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(precision_plugin=plugin), logger=False)
    assert trainer.strategy.precision_plugin is plugin


def test_precision_plugin_rejects_other_precisions(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="handles 'bf16-mixed' and '16-mixed'"):
        HPUPrecision("32-true")  # type: ignore[arg-type]


def test_mixed_precision_refused_under_lazy_emulation(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"needs torch.autocast.*Lazy Tensor Core has no autocast.*bf16-true"):
        Trainer(accelerator="hpu", devices=1, precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"needs torch\.autocast"):
        HPUPrecision("bf16-mixed")


def test_bf16_true_under_lazy_emulation(lazy_hpu: hpu.Backend) -> None:
    _, seen = _fit(precision="bf16-true")
    assert seen["param_device"] == "lazy"
    assert seen["param_dtype"] == torch.bfloat16
