"""Precision on the HPU: what ``training_step`` sees for each setting, however the precision is given."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

from lightning_gaudi import HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu
from lightning_gaudi.precision import check_precision_supported, supported_precisions


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


@pytest.mark.parametrize(
    ("precision", "named"),
    [
        ("64", "64-true"),
        (64, "64-true"),
        ("64-true", "64-true"),
        ("transformer-engine", "transformer-engine"),
        ("transformer-engine-float16", "transformer-engine-float16"),
    ],
)
def test_precisions_gaudi_cannot_run_are_refused_at_trainer(eager_hpu: hpu.Backend, precision: Any, named: str) -> None:
    with pytest.raises(ValueError, match=rf"'{named}'.*cannot run on an HPU") as error:
        Trainer(accelerator="hpu", devices=1, precision=precision)
    assert "'32-true', 'bf16-mixed', 'bf16-true', '16-mixed', '16-true'" in str(error.value)


def test_what_works_depends_on_the_hpu(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    assert supported_precisions() == ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "fp8")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    assert supported_precisions() == ("32-true", "bf16-mixed", "bf16-true")
    with pytest.raises(ValueError, match=r"Use one of '32-true', 'bf16-mixed', 'bf16-true'\."):
        Trainer(accelerator="hpu", devices=1, precision="64-true")
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "lazy")
    clean_hpu_env.delenv(hpu.DEVICE_NAME_ENV)
    assert supported_precisions() == ("32-true", "bf16-true", "16-true", "fp8")  # FP8 casts work on Lazy Tensor Core


@pytest.mark.parametrize(
    ("plugin", "match"),
    [
        (lambda: DoublePrecision(), r"DoublePrecision \(precision '64-true'\) cannot run on an HPU"),
        (lambda: MixedPrecision("bf16-mixed", device="cuda"), r"autocasts on 'cuda'.*HPUPrecision\('bf16-mixed'\)"),
    ],
)
def test_precision_plugins_gaudi_cannot_run_are_refused(eager_hpu: hpu.Backend, plugin: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_precision_supported(plugin())


@pytest.mark.parametrize(
    "plugin",
    [
        lambda: Precision(),
        lambda: HalfPrecision("bf16-true"),
        lambda: HalfPrecision("16-true"),
        lambda: HPUPrecision("16-mixed"),
        lambda: MixedPrecision("bf16-mixed", device="cpu"),  # eager emulation autocasts on the CPU
    ],
)
def test_precision_plugins_gaudi_runs_pass(eager_hpu: hpu.Backend, plugin: Any) -> None:
    check_precision_supported(plugin())


def test_fp16_plugin_refused_on_first_generation_gaudi(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    with pytest.raises(ValueError, match="first-generation Gaudi"):
        check_precision_supported(HalfPrecision("16-true"))


def test_mixed_precision_plugin_under_lazy_emulation_says_why(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="Lazy Tensor Core has no autocast"):
        check_precision_supported(MixedPrecision("bf16-mixed", device="cpu"))


@pytest.mark.parametrize("where", ["plugins", "strategy"])
def test_precision_plugins_gaudi_cannot_run_are_refused_at_trainer(eager_hpu: hpu.Backend, where: str) -> None:
    plugin = DoublePrecision()
    given: dict[str, Any] = (
        {"plugins": [plugin]} if where == "plugins" else {"strategy": SingleHPUStrategy(precision_plugin=plugin)}
    )
    with pytest.raises(ValueError, match=r"DoublePrecision \(precision '64-true'\) cannot run on an HPU"):
        Trainer(accelerator="hpu", devices=1, **given)


def test_lightnings_mixed_precision_on_the_hpu_device_runs_in_emulation_too(eager_hpu: hpu.Backend) -> None:
    """``MixedPrecision("bf16-mixed", device="hpu")``, as code written for a Gaudi spells it, autocasts on the HPU's
    device type: the emulated one here (Trainer and Fabric)."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins import MixedPrecision as FabricMixedPrecision

    from lightning_gaudi import fabric

    trainer = Trainer(accelerator="hpu", devices=1, plugins=[MixedPrecision("bf16-mixed", device="hpu")], logger=False)
    assert isinstance(trainer.precision_plugin, HPUPrecision)
    assert trainer.precision_plugin.device == eager_hpu.autocast_device_type == "cpu"
    runner = Fabric(accelerator="hpu", devices=1, plugins=[FabricMixedPrecision("bf16-mixed", device="hpu")])
    assert isinstance(runner.strategy.precision, fabric.HPUPrecision)
    assert runner.strategy.precision.device == "cpu"
    with pytest.raises(ValueError, match="autocasts on 'cuda', not on the HPU"):
        Trainer(accelerator="hpu", devices=1, plugins=[MixedPrecision("bf16-mixed", device="cuda")], logger=False)
