"""FP8 inference (Intel Neural Compressor's measure, then quantize) for validate, test and predict: the emulated
numerics, two runs sharing only the measurement files, the real path on the Neural Compressor double, the errors."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import transformers
from helpers.workload import quiet_trainer
from lightning.pytorch import LightningModule, seed_everything
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FP8Inference
from lightning_gaudi.fp8 import E4M3, finalize_fp8_calibration, prepare_fp8_inference
from lightning_gaudi.fp8.formats import quantize_dequantize
from lightning_gaudi.hpu.bridge import HabanaBackend

#: E4M3 keeps 3 mantissa bits: each operand is off by at most 2**-4 of itself; the outputs stay well within this
#: fraction of their largest magnitude (measured: 0.4% to 5%).
FP8_TOLERANCE = 0.08


def _data(batches: int = 4, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * 8, 16, generator=generator)
    return DataLoader(TensorDataset(x, torch.tanh(x)), batch_size=8)


class Mlp(LightningModule):
    """16 -> 48 -> 16, evaluated in every loop; ``losses`` holds the evaluation losses, by loop."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16))
        self.losses: dict[str, list[Tensor]] = {"val": [], "test": []}

    def _loss(self, batch: tuple[Tensor, Tensor], loop: str) -> Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses[loop].append(loss.detach())
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return F.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._loss(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._loss(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _twin(model: LightningModule) -> LightningModule:
    """A freshly built model with ``model``'s weights: what a second process would load."""
    twin = type(model)()
    twin.load_state_dict(model.state_dict())
    return twin


def _close_but_not_equal(fp8: Tensor, fp32: Tensor) -> None:
    assert not torch.equal(fp8, fp32)
    assert (fp8 - fp32).abs().max() <= FP8_TOLERANCE * fp32.abs().max()


# ----------------------------------------------------------------------------------------------------------------------
# The emulated numerics
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager_hpu", "lazy_hpu"])
def test_quantized_linear_is_fp8_rounding_of_inputs_and_weights(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    device = request.getfixturevalue(backend).device()
    seed_everything(0, verbose=False)
    model = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)).to(device)
    reference = copy.deepcopy(model)
    x = torch.randn(32, 16)
    stats = tmp_path / "measure"
    prepare_fp8_inference(model, "measure", stats)
    model(x[:16].to(device))
    model(x[16:].to(device))  # the range is over every calibration batch
    finalize_fp8_calibration(model)
    assert [p.name for p in stats.parent.iterdir()] == ["measure_hooks_maxabs.pt"]
    measured = torch.load(f"{stats}_hooks_maxabs.pt", weights_only=True)
    assert measured["0"] == pytest.approx(float(x.abs().max()))

    quantized = prepare_fp8_inference(copy.deepcopy(reference), "quantize", stats)
    assert quantized.state_dict().keys() == reference.state_dict().keys()
    with torch.no_grad():
        out, expected = quantized(x.to(device)).cpu(), reference(x.to(device)).cpu()
        first = reference[0].cpu()
        scale_x, scale_w = E4M3.max / x.abs().max(), E4M3.max / first.weight.abs().max()
        layer = F.linear(quantize_dequantize(x, scale_x, E4M3), quantize_dequantize(first.weight, scale_w, E4M3))
        assert torch.allclose(quantized[0](x.to(device)).cpu(), layer + first.bias, atol=1e-6)
    _close_but_not_equal(out, expected)


# ----------------------------------------------------------------------------------------------------------------------
# The callback: two runs, the loops, fit
# ----------------------------------------------------------------------------------------------------------------------


def test_measure_in_one_trainer_then_quantize_in_another(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    stats = tmp_path / "fp8" / "measure"
    seed_everything(0, verbose=False)
    model = Mlp()
    plain = _twin(model)
    quiet_trainer().test(plain, _data())
    measure = FP8Inference(mode="measure", stats_path=str(stats))
    quiet_trainer(callbacks=[measure], limit_val_batches=1.0).validate(model, _data())
    assert torch.equal(torch.stack(model.losses["val"]), torch.stack(plain.losses["test"]))  # measuring changes nothing
    assert (tmp_path / "fp8" / "measure_hooks_maxabs.pt").is_file()

    quantized = _twin(model)  # shares nothing with the measured run but the files
    callback = FP8Inference(stats_path=str(stats))
    quiet_trainer(callbacks=[callback]).test(quantized, _data())
    assert type(quantized.net[0]).__name__ == "_FP8InferenceLinear"
    _close_but_not_equal(torch.stack(quantized.losses["test"]), torch.stack(plain.losses["test"]))

    predictions = quiet_trainer(callbacks=[callback]).predict(quantized, _data())  # prepared already: left as it is
    expected = quiet_trainer().predict(plain, _data())
    assert predictions is not None
    assert expected is not None
    _close_but_not_equal(torch.cat(predictions), torch.cat(expected))  # type: ignore[arg-type]


def test_fit_ignores_it_and_refuses_a_quantized_model(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    stats = tmp_path / "measure"
    model = Mlp()
    trainer = quiet_trainer(
        callbacks=[FP8Inference(mode="measure", stats_path=str(stats))], limit_train_batches=2, limit_val_batches=2
    )
    with pytest.warns(UserWarning, match="FP8Inference does nothing in trainer.fit"):
        trainer.fit(model, _data(), _data())
    assert len(model.losses["val"]) == 2  # fit's validation ran, unmeasured
    assert all(type(m) is nn.Linear for m in model.net if isinstance(m, nn.Linear))
    assert list(tmp_path.iterdir()) == []

    trainer.test(model, _data())  # the same Trainer measures in test
    quantized = _twin(model)
    quiet_trainer(callbacks=[FP8Inference(stats_path=str(stats))]).test(quantized, _data())
    again = quiet_trainer(callbacks=[FP8Inference(stats_path=str(stats))], max_steps=1)
    with pytest.raises(ValueError, match=r"prepared for FP8 inference \(mode 'quantize'\) and cannot train"):
        again.fit(quantized, _data())


# ----------------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------------


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mode='calibrate'; choose 'measure' \(first run\) or 'quantize'"):
        FP8Inference(mode="calibrate")  # type: ignore[arg-type]


def test_quantize_without_measurements_says_to_measure_first(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    stats = tmp_path / "nothing" / "measure"
    model = Mlp()
    with pytest.raises(FileNotFoundError, match=rf"no measurements at stats_path='{stats}'.*mode='measure'"):
        quiet_trainer(callbacks=[FP8Inference(stats_path=str(stats))]).test(model, _data())
    assert model.losses["test"] == []  # before any batch


def test_misuse_of_the_functions(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    stats = tmp_path / "measure"
    model = Mlp()
    with pytest.raises(ValueError, match="was not prepared with prepare_fp8_inference"):
        finalize_fp8_calibration(model)
    prepare_fp8_inference(model, "measure", stats)
    assert prepare_fp8_inference(model, "measure", stats) is model  # the same call again: nothing to do
    model.net(torch.randn(2, 16))
    finalize_fp8_calibration(model)
    with pytest.raises(ValueError, match=r"prepared .* with \(mode, stats_path\)=\('measure'.*one way"):
        prepare_fp8_inference(model, "quantize", stats)

    wider = [Mlp(), Mlp()]
    for each in wider:
        each.net.append(nn.Linear(16, 16))  # a layer the measurements never saw
    with pytest.raises(ValueError, match=r"no input range for \['net.3'\].*blocklist"):
        prepare_fp8_inference(wider[0], "quantize", stats)
    assert type(prepare_fp8_inference(wider[1], "quantize", stats, blocklist=["net.3"]).net[3]) is nn.Linear


def test_first_generation_gaudi_is_refused(clean_hpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    with pytest.raises(ValueError, match="needs Gaudi 2 or later; this is a first-generation GAUDI"):
        prepare_fp8_inference(Mlp(), "measure", tmp_path / "measure")


# ----------------------------------------------------------------------------------------------------------------------
# The real path: Intel Neural Compressor's double
# ----------------------------------------------------------------------------------------------------------------------


def _forget_neural_compressor() -> None:
    for name in [n for n in sys.modules if n == "neural_compressor" or n.startswith("neural_compressor.")]:
        del sys.modules[name]


@pytest.fixture
def inc_double(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The bridge path (tensors on the host) with the Neural Compressor double (``tests/bridge_double``)."""
    monkeypatch.setattr(HabanaBackend, "device_type", "cpu")
    bridge_double.configure(lazy=False)
    _forget_neural_compressor()  # its modules hold the log of the double's state they were imported with
    yield bridge_double
    _forget_neural_compressor()


def test_trainer_drives_neural_compressors_measure_then_quantize(inc_double: ModuleType, tmp_path: Path) -> None:
    stats = str(tmp_path / "inc" / "measure")
    model = Mlp()
    options = {"scale_method": "unit_scale"}
    measure = FP8Inference(mode="measure", stats_path=stats, blocklist=["lm_head"], options=options)
    quiet_trainer(callbacks=[measure]).test(model, _data(batches=3))
    names = [name for name in inc_double.names() if name.startswith("inc.")]
    assert names == ["inc.FP8Config", "inc.prepare", *["inc.measure"] * 6, "inc.finalize_calibration"]
    (config,) = inc_double.called("inc.FP8Config")
    assert {k: config.kwargs[k] for k in ("mode", "dump_stats_path", "fp8_config", "blocklist", "scale_method")} == {
        "mode": "MEASURE",
        "dump_stats_path": stats,
        "fp8_config": "E4M3",
        "blocklist": {"names": ["lm_head"], "types": []},
        "scale_method": "unit_scale",
    }
    (prepare,) = inc_double.called("inc.prepare")
    assert prepare.args[0] is model
    assert prepare.args[1].measure
    assert inc_double.called("inc.finalize_calibration")[0].args == (model,)
    assert (tmp_path / "inc" / "measure_hooks_maxabs.json").is_file()  # where Intel's writes its measurements

    inc_double.reset()
    quantized = _twin(model)
    quiet_trainer(callbacks=[FP8Inference(stats_path=stats)]).predict(quantized, _data(batches=1))
    assert [name for name in inc_double.names() if name.startswith("inc.")] == ["inc.FP8Config", "inc.convert"]
    (convert,) = inc_double.called("inc.convert")
    assert convert.args[0] is quantized
    assert convert.args[1].quantize
    assert convert.args[1].dump_stats_path == stats
    assert quantized.is_quantized


def test_a_gaudi_without_neural_compressor_says_how_to_get_it(
    inc_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "neural_compressor", None)  # type: ignore[arg-type]
    with pytest.raises(ModuleNotFoundError, match=r"Neural Compressor, which is not installed.*neural-compressor"):
        prepare_fp8_inference(Mlp(), "measure", tmp_path / "measure")


# ----------------------------------------------------------------------------------------------------------------------
# A Hugging Face model, as a user would run it
# ----------------------------------------------------------------------------------------------------------------------


class CausalLM(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        self.model = transformers.LlamaForCausalLM(config)

    def predict_step(self, batch: tuple[Tensor], batch_idx: int) -> Tensor:
        return self.model(input_ids=batch[0], use_cache=False).logits


def test_hugging_face_llama_measured_then_quantized(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    seed_everything(0, verbose=False)
    model = CausalLM()
    plain = _twin(model)
    tokens = DataLoader(TensorDataset(torch.randint(0, 128, (8, 24))), batch_size=4)
    stats = str(tmp_path / "measure")
    blocklist = ["lm_head"]
    quiet_trainer(callbacks=[FP8Inference("measure", stats, blocklist)]).predict(model, tokens)
    quantized = _twin(model)
    fp8 = quiet_trainer(callbacks=[FP8Inference("quantize", stats, blocklist)]).predict(quantized, tokens)
    fp32 = quiet_trainer().predict(plain, tokens)
    converted = [name for name, m in quantized.named_modules() if type(m).__name__ == "_FP8InferenceLinear"]
    assert len(converted) == 2 * 7  # q, k, v, o, gate, up, down in each layer; lm_head left alone
    assert type(quantized.model.lm_head) is nn.Linear
    assert fp8 is not None
    assert fp32 is not None
    _close_but_not_equal(torch.cat(fp8), torch.cat(fp32))  # type: ignore[arg-type]


def test_a_folder_as_stats_path_is_found_again(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    """``stats_path="fp8dir/"`` (a folder): measure writes ``fp8dir/_hooks_maxabs.pt`` and quantize finds it."""
    stats = f"{tmp_path / 'fp8dir'}/"
    model = Mlp()
    quiet_trainer(callbacks=[FP8Inference(mode="measure", stats_path=stats)]).test(model, _data())
    assert (tmp_path / "fp8dir" / "_hooks_maxabs.pt").is_file()
    quantized = _twin(model)
    quiet_trainer(callbacks=[FP8Inference(stats_path=stats)]).test(quantized, _data())
    assert type(quantized.net[0]).__name__ == "_FP8InferenceLinear"


@pytest.mark.parametrize("damage", [b"", b"not a zip archive at all", None])
def test_a_damaged_measurements_file_names_itself_and_says_measure_again(
    eager_hpu: hpu.Backend, tmp_path: Path, damage: bytes | None
) -> None:
    stats = tmp_path / "measure"
    model = Mlp()
    quiet_trainer(callbacks=[FP8Inference(mode="measure", stats_path=str(stats))]).test(model, _data())
    path = tmp_path / "measure_hooks_maxabs.pt"
    if damage is None:
        torch.save([1.0, 2.0], path)  # a readable file, but not measurements
    else:
        path.write_bytes(damage)
    with pytest.raises(ValueError, match=rf"measurements file '{path}' is damaged.*Measure again"):
        prepare_fp8_inference(_twin(model), "quantize", stats)


def test_each_rank_measures_into_its_own_file_and_quantizes_from_it(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As INC: on 2 ranks each writes ``<stats_path>_hooks_maxabs_<rank>_2.pt`` with the ranges it saw (one shared
    file kept the last writer's alone) and quantizes with its own."""
    from lightning_gaudi.fp8 import inference

    stats = tmp_path / "measure"
    rank = [0]
    monkeypatch.setattr(inference.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(inference.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(inference.dist, "get_rank", lambda group=None: rank[0])
    model = Mlp()
    for rank[0], scale in ((0, 1.0), (1, 10.0)):  # rank 1 sees inputs 10x larger
        measured = prepare_fp8_inference(_twin(model), "measure", stats)
        measured.net(scale * torch.randn(8, 16))
        finalize_fp8_calibration(measured)
    ranges = [torch.load(tmp_path / f"measure_hooks_maxabs_{r}_2.pt") for r in (0, 1)]
    assert ranges[1]["net.0"] > 5 * ranges[0]["net.0"]
    assert not (tmp_path / "measure_hooks_maxabs.pt").exists()
    scales = []
    for rank[0] in (0, 1):
        scales.append(float(prepare_fp8_inference(_twin(model), "quantize", stats).net[0].input_scale))
    assert scales[1] < scales[0] / 5  # each from its own rank's range
    monkeypatch.setattr(inference.dist, "get_world_size", lambda group=None: 4)
    with pytest.raises(FileNotFoundError, match=r"no measurements for this rank .*_1_4\.pt.*as many ranks as measured"):
        prepare_fp8_inference(_twin(model), "quantize", stats)
