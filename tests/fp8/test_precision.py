"""FP8 training through the Trainer and Fabric on the emulated HPU: by name, as an instance, and refused where it
cannot run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.workload import quiet_trainer
from lightning.fabric import Fabric
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import fabric as lg_fabric
from lightning_gaudi import hpu
from lightning_gaudi.fp8 import FP8Linear, FP8Recipe, HPUFP8Precision
from lightning_gaudi.precision import check_precision_supported, supported_precisions

#: FP8's loss after the short fit below stays within this fraction of bf16's (measured: 0.8% to 1.3% over 3 seeds).
TOLERANCE = 0.05


class Regression(LightningModule):
    """An MLP of FP8-sized layers (16 -> 64 -> 64 -> 16) fitting a fixed random tanh map; records its losses."""

    def __init__(self, optimizer: str = "adamw", steps: int = 48) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16))
        self.optimizer = optimizer
        self.steps = steps
        self.losses: list[Tensor] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = ((self.net(x).float() - y) ** 2).mean()
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.05)
        return torch.optim.AdamW(self.parameters(), lr=3e-3)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.steps * 32, 16, generator=generator)
        y = torch.tanh(x @ (torch.randn(16, 16, generator=generator) / 4)) * 2
        return DataLoader(TensorDataset(x, y), batch_size=32)


def _fit(precision: str | None = None, **kwargs: Any) -> tuple[Trainer, Regression]:
    seed_everything(0, verbose=False)
    model = Regression(kwargs.pop("optimizer", "adamw"))
    trainer = quiet_trainer(**({"precision": precision} if precision else {}), **kwargs)
    trainer.fit(model)
    return trainer, model


def test_trainer_takes_fp8_by_name(eager_hpu: hpu.Backend) -> None:
    trainer, model = _fit("fp8", max_steps=2)
    assert isinstance(trainer.precision_plugin, HPUFP8Precision)
    assert trainer.precision == "fp8"
    assert [type(layer) for layer in model.net if isinstance(layer, nn.Linear)] == [FP8Linear] * 3
    assert model.net[0].fp8_steps.item() == 2  # the steps ran in FP8
    assert model.net[0].recipe == FP8Recipe()


def test_trainer_takes_an_instance_with_its_recipe(eager_hpu: hpu.Backend) -> None:
    plugin = HPUFP8Precision(recipe=FP8Recipe(format="hybrid", amax_history_len=16, margin=0))
    trainer, model = _fit(plugins=[plugin], max_steps=2)
    assert trainer.precision_plugin is plugin
    assert model.net[2].fp8_amax_history.shape == (3, 16)


def test_fabric_takes_fp8_by_name(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", devices=1, precision="fp8")
    assert isinstance(fabric.strategy.precision, lg_fabric.HPUFP8Precision)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    model, optimizer = fabric.setup(module, optimizer)
    out = model(torch.randn(4, 16))
    assert out.dtype == torch.bfloat16  # the rest of the step is bf16 autocast
    fabric.backward(out.float().pow(2).mean())
    optimizer.step()
    assert isinstance(module[0], FP8Linear)
    assert module[0].fp8_steps.item() == 1
    assert module[2].fp8_amax_history[2, 0] > 0  # the gradient was recorded in backward


@pytest.mark.parametrize("owner", ["Trainer", "Fabric"])
def test_other_accelerators_refuse_fp8_with_the_fix(clean_hpu_env: pytest.MonkeyPatch, owner: str) -> None:
    build = Trainer if owner == "Trainer" else Fabric
    with pytest.raises(ValueError, match=rf"`{owner}\(precision='fp8'\)` is lightning_gaudi's FP8 training") as error:
        build(accelerator="cpu", devices=1, precision="fp8")
    assert f"Use `{owner}(accelerator='hpu', precision='fp8')`" in str(error.value)
    assert "transformer-engine" in str(error.value)
    with pytest.raises(ValueError, match="Precision 'fp9' is invalid"):  # Lightning's own check is untouched
        build(accelerator="cpu", devices=1, precision="fp9")


@pytest.mark.parametrize("strategy", ["hpu_fsdp", "hpu_deepspeed_stage_2"])
def test_sharded_strategies_refuse_fp8_before_any_process_starts(eager_hpu: hpu.Backend, strategy: str) -> None:
    if "deepspeed" in strategy and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed (pip install '.[deepspeed]')")
    with pytest.raises(ValueError, match=r"precision='fp8'.* not supported with HPU.*'hpu_parallel'"):
        Trainer(accelerator="hpu", devices=2, strategy=strategy, precision="fp8")


def test_first_generation_gaudi_refuses_fp8(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    message = r"needs FP8 matrix units, which first-generation Gaudi \(GAUDI\) does not have"
    with pytest.raises(ValueError, match=message):
        Trainer(accelerator="hpu", devices=1, precision="fp8")
    with pytest.raises(ValueError, match=message):
        Fabric(accelerator="hpu", devices=1, precision="fp8")
    with pytest.raises(ValueError, match=message):
        HPUFP8Precision()
    with pytest.raises(ValueError, match=message):
        lg_fabric.HPUFP8Precision()
    assert "fp8" not in supported_precisions()
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI3")
    assert "fp8" in supported_precisions()


def test_a_bad_recipe_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="format='e5m2'"):
        HPUFP8Precision(recipe={"format": "e5m2"})


def test_transformer_engine_points_to_fp8(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"use `precision='fp8'`"):
        check_precision_supported("transformer-engine")


def test_short_fit_converges_within_tolerance_of_bf16(eager_hpu: hpu.Backend) -> None:
    final = {}
    for precision in ("bf16-mixed", "fp8"):
        _, model = _fit(precision, max_steps=48)
        losses = torch.stack(model.losses)
        assert losses[-8:].mean() < losses[:4].mean() / 3, precision  # it learns
        final[precision] = losses[-8:].mean().item()
    assert abs(final["fp8"] - final["bf16-mixed"]) <= TOLERANCE * final["bf16-mixed"], final


def test_lazy_emulation_runs_fp8_without_host_fallbacks(lazy_hpu: hpu.Backend) -> None:
    lazy_hpu.reset_lazy_counters()
    _, model = _fit("fp8", max_steps=6, optimizer="sgd")
    counters = lazy_hpu.lazy_counters()
    assert counters is not None
    assert counters.cpu_fallbacks == {}
    assert model.net[0].fp8_steps.cpu().item() == 6
    assert torch.isfinite(torch.stack(model.losses).cpu()).all()


def test_checkpoints_hold_plain_weights_and_the_scaling_state(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    _, trained = _fit("fp8", max_steps=4, enable_checkpointing=True, callbacks=[checkpoint])
    path = tmp_path / "last.ckpt"
    saved = torch.load(path, weights_only=True)
    plain = Regression()
    plain.load_state_dict(saved["state_dict"])  # strict, into the model without FP8
    assert torch.equal(plain.net[0].weight, trained.net[0].weight)
    assert saved["HPUFP8Precision"]["net.0"]["fp8_steps"].item() == 4  # the scaling state, beside the model
    resumed = Regression()
    trainer = quiet_trainer(precision="fp8", max_steps=6, max_epochs=2)
    trainer.fit(resumed, ckpt_path=path)
    assert resumed.net[0].fp8_steps.item() == 6  # the scaling state came back and went on
    # a checkpoint written without FP8 resumes in FP8
    bf16_path = tmp_path / "bf16.ckpt"
    _fit("bf16-mixed", max_steps=2)[0].save_checkpoint(bf16_path)
    quiet_trainer(precision="fp8", max_steps=3).fit(Regression(), ckpt_path=bf16_path)
