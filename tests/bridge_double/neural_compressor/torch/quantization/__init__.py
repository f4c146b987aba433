"""Test double of ``neural_compressor.torch.quantization``, Intel Neural Compressor's FP8 flow on Gaudi.

Shaped as Intel's source (intel/neural-compressor, ``neural_compressor/torch/quantization/quantize.py`` and
``config.py``), its FP8 example (``examples/helloworld/fp8_example``) and lightning-habana call it:
``FP8Config(dump_stats_path="./hqt_output/measure", fp8_config="E4M3", hp_dtype="bf16", blocklist=..., allowlist=...,
mode="AUTO", scale_method="maxabs_hw", ..., observer="maxabs", ..., **kwargs)`` with ``.measure`` / ``.quantize``;
``prepare(model, quant_config, inplace=True, example_inputs=None)`` (measure mode), ``convert(model,
quant_config=None, inplace=True, **kwargs)`` (quantize mode) and ``finalize_calibration(model)``, which writes the
measurements to ``<dump_stats_path>_hooks_<observer>.json`` (and ``.npz``).

The double cannot compute in FP8: ``prepare`` records a ``"inc.measure"`` call for each forward of a prepared
``nn.Linear`` (the calibration), ``finalize_calibration`` writes a JSON file of those counts where Intel's writes its
measurements, and ``convert`` in quantize mode fails like Intel's without that file, marks the model quantized and
leaves its numerics alone. Every call is logged in ``_bridge_double_state`` (names ``"inc.FP8Config"``,
``"inc.prepare"``, ``"inc.measure"``, ``"inc.finalize_calibration"``, ``"inc.convert"``).
"""

import json
import os

import _bridge_double_state as _state
import torch

__all__ = ["FP8Config", "convert", "finalize_calibration", "prepare"]


class FP8Config:
    def __init__(
        self,
        dump_stats_path="./hqt_output/measure",
        fp8_config="E4M3",
        hp_dtype="bf16",
        blocklist={"names": [], "types": ()},  # noqa: B006 - Intel's signature
        allowlist={"names": [], "types": ()},  # noqa: B006 - Intel's default is its list of supported modules
        mode="AUTO",
        scale_method="maxabs_hw",
        scale_params={},  # noqa: B006
        observer="maxabs",
        mod_dict={},  # noqa: B006
        measure_exclude="OUTPUT",
        fake_quant=False,
        use_qdq=False,
        scale_format="scalar",
        measure_on_hpu=True,
        **kwargs,
    ):
        settings = {key: value for key, value in locals().items() if key not in ("self", "kwargs")}
        settings.update(kwargs)
        _state.record("inc.FP8Config", **settings)
        for key, value in settings.items():
            setattr(self, key, value)

    @property
    def measure(self):
        return self.mode == "MEASURE"

    @property
    def quantize(self):
        return self.mode == "QUANTIZE"

    @classmethod
    def from_dict(cls, config_dict):
        return cls(**config_dict)

    @classmethod
    def from_json_file(cls, filename):
        with open(filename, encoding="utf-8") as file:
            return cls.from_dict(json.load(file))


def _measurement_file(config):
    return f"{config.dump_stats_path}_hooks_{config.observer}.json"


def prepare(model, quant_config, inplace=True, example_inputs=None):
    _state.record("inc.prepare", model, quant_config, inplace=inplace, example_inputs=example_inputs)
    os.makedirs(os.path.dirname(quant_config.dump_stats_path) or ".", exist_ok=True)
    counts = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            counts[name] = 0

            def measure(module, args, name=name):
                counts[name] += 1
                _state.record("inc.measure", name)

            module.register_forward_pre_hook(measure)
    model.is_prepared = True
    model.quant_config = quant_config
    model._double_measure_counts = counts
    return model


def finalize_calibration(model):
    _state.record("inc.finalize_calibration", model)
    with open(_measurement_file(model.quant_config), "w", encoding="utf-8") as file:
        json.dump(model._double_measure_counts, file)


def convert(model, quant_config=None, inplace=True, **kwargs):
    _state.record("inc.convert", model, quant_config, inplace=inplace, **kwargs)
    if quant_config.quantize and not os.path.isfile(_measurement_file(quant_config)):
        raise FileNotFoundError(_measurement_file(quant_config))
    model.is_quantized = True
    return model
