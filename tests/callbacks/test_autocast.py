"""BF16Autocast: op lists change dtypes under emulation; on Gaudi they must be the runtime's (the bridge's files)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import BF16Autocast


class DtypeProbe(Workload):
    """Records what ``linear``, ``exp`` and ``add`` return in training_step, validation_step and predict_step."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: dict[str, dict[str, torch.dtype]] = {}

    def _probe(self, stage: str, x: Tensor) -> Tensor:
        hidden = self.net[0](x)
        self.dtypes[stage] = {"linear": hidden.dtype, "exp": torch.exp(x).dtype, "add": (x + x).dtype}
        return self.net[2](self.net[1](hidden))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return ((self._probe("train", x) - y) ** 2).float().mean()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._probe("validate", batch[0])

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._probe("predict", batch[0])


def _dtypes(*callbacks: BF16Autocast) -> dict[str, torch.dtype]:
    """The dtypes seen in training, validation and predict (which must agree)."""
    model = DtypeProbe()
    trainer = quiet_trainer(precision="bf16-mixed", max_steps=1, limit_val_batches=1, callbacks=list(callbacks))
    trainer.fit(model, loader(2))
    trainer.validate(model, loader(1), verbose=False)
    trainer.predict(model, loader(1))
    assert set(model.dtypes) == {"train", "validate", "predict"}
    assert model.dtypes["train"] == model.dtypes["validate"] == model.dtypes["predict"], model.dtypes
    return model.dtypes["train"]


def test_eager_lists_change_dtypes(eager_hpu: hpu.Backend) -> None:
    stock = _dtypes()
    assert stock == {"linear": torch.bfloat16, "exp": torch.float32, "add": torch.float32}
    listed = _dtypes(BF16Autocast(bf16_ops=["exp", "add"], fp32_ops=["linear"]))
    assert listed == {"linear": torch.float32, "exp": torch.bfloat16, "add": torch.bfloat16}
    assert _dtypes(BF16Autocast()) == stock  # no lists: the device's own policy


def test_lists_only_apply_inside_autocast_and_are_removed_after_fit(eager_hpu: hpu.Backend) -> None:
    callback = BF16Autocast(fp32_ops=["linear"])
    trainer = quiet_trainer(precision="bf16-mixed", max_steps=1, callbacks=[callback])
    trainer.fit(DtypeProbe(), loader(2))
    assert trainer.precision_plugin.op_lists is None
    with trainer.precision_plugin.forward_context():
        assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"bf16_ops": ["linaer"]}, ValueError, "'linaer'.*Did you mean 'linear'"),
        ({"fp32_ops": ["log_sofmax"]}, ValueError, "Did you mean 'log_softmax'"),
        ({"bf16_ops": ["mm", "gelu"], "fp32_ops": ["gelu"]}, ValueError, r"\['gelu'\] are in both"),
        ({"bf16_ops": "linear"}, TypeError, "list of op names"),
    ],
)
def test_bad_op_lists(eager_hpu: hpu.Backend, kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        BF16Autocast(**kwargs)


def test_needs_bf16_mixed(eager_hpu: hpu.Backend) -> None:
    trainer = quiet_trainer(max_steps=1, callbacks=[BF16Autocast(fp32_ops=["linear"])])
    with pytest.raises(ValueError, match="precision='bf16-mixed'"):
        trainer.fit(Workload(), loader(2))


def test_lists_need_hpu_precision(eager_hpu: hpu.Backend) -> None:
    plugin = MixedPrecision("bf16-mixed", device="cpu")
    trainer = quiet_trainer(max_steps=1, plugins=[plugin], callbacks=[BF16Autocast(fp32_ops=["linear"])])
    with pytest.raises(ValueError, match=r"through lightning_gaudi.HPUPrecision, not MixedPrecision"):
        trainer.fit(Workload(), loader(2))


def test_runtime_lists_apply_without_lists_of_its_own(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    hpu.configure(autocast_bf16_ops=["exp", "add"], autocast_fp32_ops=["linear"], autocast_list_dir=str(tmp_path))
    assert _dtypes(BF16Autocast()) == {"linear": torch.float32, "exp": torch.bfloat16, "add": torch.bfloat16}
    assert _dtypes(BF16Autocast(fp32_ops=["exp"]))["exp"] == torch.float32  # this Trainer's list wins


def test_on_gaudi_lists_must_be_the_ones_the_bridge_loaded(
    bridge_double: ModuleType, isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hpu.configure(autocast_bf16_ops=["linear", "matmul"], autocast_list_dir=str(tmp_path))
    hpu.get_backend().is_available()  # loads the bridge
    trainer = SimpleNamespace(precision_plugin=MixedPrecision("bf16-mixed", device="cpu"))
    BF16Autocast().setup(trainer, None, "fit")  # type: ignore[arg-type]
    BF16Autocast(bf16_ops=["linear", "matmul"]).setup(trainer, None, "fit")  # type: ignore[arg-type]
    assert getattr(trainer.precision_plugin, "op_lists", None) is None  # the bridge applies its lists itself
    with pytest.raises(RuntimeError, match=r"did not load.*configure\(autocast_fp32_ops=\['softmax'\]\)"):
        BF16Autocast(fp32_ops=["softmax"]).setup(trainer, None, "fit")  # type: ignore[arg-type]


def test_lazy_emulation_has_no_autocast(lazy_hpu: hpu.Backend) -> None:
    callback = BF16Autocast(fp32_ops=["linear"])  # the lists are valid; the emulated device has no autocast
    with pytest.raises(ValueError, match="Lazy Tensor Core has no autocast"):
        quiet_trainer(precision="bf16-mixed", callbacks=[callback])
