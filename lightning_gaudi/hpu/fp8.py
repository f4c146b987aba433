"""Intel's FP8 APIs on Gaudi 2 and later as the seam hands them out: training (``transformer_engine``) and inference
(Intel Neural Compressor); emulated backends have neither (:mod:`lightning_gaudi.fp8` emulates FP8)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

from torch import nn

#: ``recipe.Format`` member names by the recipe's format name.
FORMAT_NAMES = {"hybrid": "HYBRID", "e4m3": "E4M3"}
#: The state-dict entries of ``nn.Linear``: what a converted layer's state dict keeps.
LINEAR_KEYS = ("weight", "bias")


def _linear_keys_only(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix) :] not in LINEAR_KEYS]:
        del state_dict[key]


def _keep_fp8_metadata(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    # a state dict without Transformer Engine's metadata (a plain nn.Linear's) leaves the layer's own in place
    key = f"{prefix}_extra_state"
    if key not in state_dict and type(module).get_extra_state is not nn.Module.get_extra_state:
        state_dict[key] = module.get_extra_state()


class TransformerEngine:
    """Intel's ``transformer_engine`` module (``te``) and its ``recipe`` module, as the FP8 precision needs them."""

    def __init__(self, te: ModuleType, recipe: ModuleType) -> None:
        self._te = te
        self._recipe = recipe

    def linear(self, linear: nn.Linear) -> nn.Module:
        """A ``te.Linear`` sharing ``linear``'s weight and bias, with ``nn.Linear``'s state dict (the FP8 metadata
        is saved apart, :meth:`fp8_state`), so checkpoints load with and without FP8."""
        layer: nn.Module = self._te.Linear(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            params_dtype=linear.weight.dtype,
            skip_weight_param_allocation=True,
        )
        layer.weight = linear.weight
        if linear.bias is not None:
            layer.bias = linear.bias
        layer.register_state_dict_post_hook(_linear_keys_only)
        layer.register_load_state_dict_pre_hook(_keep_fp8_metadata)
        return layer

    @staticmethod
    def fp8_state(layer: nn.Module) -> Any:
        """A ``te.Linear``'s FP8 metadata (Transformer Engine's ``get_extra_state()``), for a checkpoint."""
        return layer.get_extra_state()

    @staticmethod
    def load_fp8_state(layer: nn.Module, state: Any) -> None:
        """Restores what :meth:`fp8_state` returned (``set_extra_state``)."""
        layer.set_extra_state(state)

    def is_fp8_module(self, module: nn.Module) -> bool:
        """Whether ``module`` is one of the bridge's FP8 layers already (``te.Linear``)."""
        return isinstance(module, self._te.Linear)

    def delayed_scaling(
        self, fp8_format: str, margin: int, interval: int, amax_history_len: int, amax_compute_algo: str
    ) -> Any:
        """``recipe.DelayedScaling`` with these settings (``fp8_format``: ``"hybrid"`` or ``"e4m3"``)."""
        return self._recipe.DelayedScaling(
            margin=margin,
            interval=interval,
            fp8_format=getattr(self._recipe.Format, FORMAT_NAMES[fp8_format]),
            amax_history_len=amax_history_len,
            amax_compute_algo=amax_compute_algo,
        )

    def fp8_autocast(self, fp8_recipe: Any) -> AbstractContextManager[Any]:
        """``te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)``: the FP8 layers compute in FP8 inside it."""
        return self._te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)


class NeuralCompressor:
    """Intel Neural Compressor's FP8 inference API (``neural_compressor.torch.quantization``); ``config`` holds keyword
    arguments of its ``FP8Config`` (``mode``, ``dump_stats_path``, ``blocklist``, ...)."""

    def __init__(self, quantization: ModuleType) -> None:
        self._inc = quantization

    def prepare(self, module: nn.Module, config: Mapping[str, Any]) -> nn.Module:
        """Measure mode: observers on ``module``'s supported layers, in place (``prepare``)."""
        return self._inc.prepare(module, self._inc.FP8Config(**config))

    def convert(self, module: nn.Module, config: Mapping[str, Any]) -> nn.Module:
        """Quantize mode: ``module``'s supported layers in FP8 with the measured scales, in place (``convert``)."""
        return self._inc.convert(module, self._inc.FP8Config(**config))

    def finalize_calibration(self, module: nn.Module) -> None:
        """Writes what a prepared ``module`` measured to its ``dump_stats_path`` (``finalize_calibration``)."""
        self._inc.finalize_calibration(module)
