"""BF16Autocast: op lists change dtypes under emulation and become the bridge's list files on Gaudi."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import BF16Autocast
from lightning_gaudi.callbacks.autocast import BF16_LIST_ENV, FP32_LIST_ENV, LEGACY_ENV


class DtypeProbe(Workload):
    def __init__(self) -> None:
        super().__init__()
        self.dtypes: dict[str, torch.dtype] = {}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        hidden = self.net[0](x)
        self.dtypes = {"linear": hidden.dtype, "exp": torch.exp(x).dtype, "add": (x + x).dtype}
        return ((self.net[2](self.net[1](hidden)) - y) ** 2).float().mean()


def _dtypes(*callbacks: BF16Autocast) -> dict[str, torch.dtype]:
    model = DtypeProbe()
    quiet_trainer(precision="bf16-mixed", max_steps=1, callbacks=list(callbacks)).fit(model, loader(2))
    return model.dtypes


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
    assert "autocast_context_manager" not in vars(trainer.precision_plugin)
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


def test_bridge_writes_list_files_before_load(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for env in (BF16_LIST_ENV, FP32_LIST_ENV, *LEGACY_ENV.values()):
        monkeypatch.setenv(env, "")  # records the original state, restored after the test
        monkeypatch.delenv(env)
    assert not hpu.bridge_loaded()
    callback = BF16Autocast(bf16_ops=["linear", "matmul"], fp32_ops=["softmax"], list_dir=tmp_path)
    assert Path(os.environ[BF16_LIST_ENV]).read_text().split() == ["linear", "matmul"]
    assert Path(os.environ[FP32_LIST_ENV]).read_text().split() == ["softmax"]
    assert os.environ[LEGACY_ENV[BF16_LIST_ENV]] == os.environ[BF16_LIST_ENV]
    assert callback.list_files[FP32_LIST_ENV].parent == tmp_path

    hpu.get_backend().is_available()  # loads the bridge
    assert hpu.bridge_loaded()
    BF16Autocast(bf16_ops=["linear", "matmul"], fp32_ops=["softmax"])  # the same lists: nothing to change
    with pytest.raises(RuntimeError, match=r"already imported.*before the Trainer"):
        BF16Autocast(bf16_ops=["linear"])


def test_lazy_emulation_has_no_autocast(lazy_hpu: hpu.Backend) -> None:
    callback = BF16Autocast(fp32_ops=["linear"])  # the lists are valid; the emulated device has no autocast
    with pytest.raises(ValueError, match="Lazy Tensor Core has no autocast"):
        quiet_trainer(precision="bf16-mixed", callbacks=[callback])
