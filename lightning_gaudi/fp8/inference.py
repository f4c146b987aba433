"""FP8 inference through Intel Neural Compressor (INC): ``measure`` records the layers' ranges into files at
``stats_path``, ``quantize`` (later, in any process) runs them in FP8 with those scales; emulated without INC."""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.checkpoint_io import atomic_torch_save
from lightning_gaudi.fp8.formats import E4M3, E5M2, FP8Format, quantize_dequantize, scale_from_amax

MODES = ("measure", "quantize")
#: INC's default ``dump_stats_path``: a directory and the prefix of the measurement files.
DEFAULT_STATS_PATH = "./hqt_output/measure"
#: INC names its files ``<stats_path>_hooks_<observer>[_<rank>_<world size>].json|.npz``, the emulator its
#: ``<stats_path>_hooks_maxabs[_<rank>_<world size>].pt``. ``stats_path`` is a prefix: ``"fp8/"`` puts them in ``fp8``.
_HOOKS = "_hooks_"
_PREPARED, _MEASURED = "_fp8_inference", "_fp8_input_amax"  # set on a prepared module


def _measurements(stats_path: str | os.PathLike[str]) -> list[str]:
    return sorted(glob.glob(f"{glob.escape(os.fspath(stats_path))}{_HOOKS}*"))


def _emulated_file(stats_path: str | os.PathLike[str]) -> str:
    """This rank's file of the emulator's measurements (one per rank in a distributed run, as INC writes)."""
    rank = ""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank = f"_{dist.get_rank()}_{dist.get_world_size()}"
    return f"{os.fspath(stats_path)}{_HOOKS}maxabs{rank}.pt"


def check_fp8_inference(mode: str, stats_path: str | os.PathLike[str] | None = None) -> None:
    """Raises for a mode not in :data:`MODES` or, given ``stats_path``, when ``quantize`` finds no measurements."""
    if mode not in MODES:
        raise ValueError(f"FP8 inference got mode={mode!r}; choose 'measure' (first run) or 'quantize' (later runs).")
    if mode == "quantize" and stats_path is not None and not _measurements(stats_path):
        path = os.fspath(stats_path)
        raise FileNotFoundError(
            f"FP8 inference mode='quantize' found no measurements at stats_path='{path}' (files {path}{_HOOKS}*)."
            " Run it with mode='measure' and the same stats_path first."
        )


def fp8_inference_mode(module: nn.Module) -> str | None:
    """The mode :func:`prepare_fp8_inference` prepared ``module`` for, or ``None``."""
    prepared = getattr(module, _PREPARED, None)
    return None if prepared is None else prepared[0]


def prepare_fp8_inference(
    module: nn.Module,
    mode: str = "quantize",
    stats_path: str | os.PathLike[str] = DEFAULT_STATS_PATH,
    blocklist: Sequence[str] = (),
    **options: Any,
) -> nn.Module:
    """Prepares ``module`` for FP8 inference in ``mode``, in place (again with the same mode and path: nothing), and
    returns it. For Fabric and loops of your own; the Trainer's is the ``FP8Inference`` callback.

    Args:
        module: the model.
        mode: ``"measure"`` records the layers' ranges over the batches run next (write them with
            :func:`finalize_fp8_calibration`); ``"quantize"`` runs the layers in FP8 with scales from them.
        stats_path: the measurements' directory and file-name prefix (INC's ``dump_stats_path``).
        blocklist: layers left in high precision, by (part of) their qualified name, e.g. ``["lm_head"]``.
        **options: more settings of INC's ``FP8Config`` (``scale_method``, ``hp_dtype``, ...); the emulator reads
            ``fp8_config`` alone (``"E4M3"``, the default, or ``"E5M2"``).
    """
    check_fp8_inference(mode, stats_path)
    wanted, prepared = (mode, os.fspath(stats_path)), getattr(module, _PREPARED, None)
    if prepared == wanted:
        return module
    if prepared is not None:
        raise ValueError(
            f"{type(module).__name__} was prepared for FP8 inference with (mode, stats_path)={prepared} and cannot be"
            f" prepared again with {wanted}: the change is one way. Build the model again (load its weights) first."
        )
    backend = hpu.get_backend()
    if not backend.supports_fp8():
        raise ValueError(f"FP8 inference needs Gaudi 2 or later; this is a first-generation {backend.device_name()}.")
    blocked = {"names": list(blocklist), "types": []}
    config = {"mode": mode.upper(), "dump_stats_path": wanted[1], "fp8_config": "E4M3", "blocklist": blocked, **options}
    compressor = backend.neural_compressor() or EmulatedNeuralCompressor()
    module = compressor.prepare(module, config) if mode == "measure" else compressor.convert(module, config)
    setattr(module, _PREPARED, wanted)
    return module


def finalize_fp8_calibration(module: nn.Module) -> None:
    """Writes what ``module``, prepared in ``measure`` mode, measured so far."""
    if fp8_inference_mode(module) != "measure":
        raise ValueError(f"{type(module).__name__} was not prepared with prepare_fp8_inference(mode='measure').")
    (hpu.get_backend().neural_compressor() or EmulatedNeuralCompressor()).finalize_calibration(module)


class EmulatedNeuralCompressor:
    """:class:`~lightning_gaudi.hpu.fp8.NeuralCompressor`'s contract for ``nn.Linear`` layers: input and weight pass
    through E4M3 at per-tensor scales ``448 / amax`` (the input's measured), accumulating in float32."""

    def prepare(self, module: nn.Module, config: Mapping[str, Any]) -> nn.Module:
        amax: dict[str, Tensor] = {}

        def record(name: str, layer: nn.Module, args: tuple[Tensor, ...]) -> None:
            x = args[0].detach().abs().max().float()
            amax[name] = torch.maximum(amax[name], x) if name in amax else x

        for name, layer in _linear_layers(module, config):
            layer.register_forward_pre_hook(functools.partial(record, name))
        setattr(module, _MEASURED, (_emulated_file(config["dump_stats_path"]), amax))
        return module

    def finalize_calibration(self, module: nn.Module) -> None:
        path, amax = getattr(module, _MEASURED)
        atomic_torch_save({name: float(value) for name, value in amax.items()}, path)

    def convert(self, module: nn.Module, config: Mapping[str, Any]) -> nn.Module:
        fmt = {"E4M3": E4M3, "E5M2": E5M2}.get(config["fp8_config"])
        if fmt is None:
            raise ValueError(f"Emulated FP8 inference got fp8_config={config['fp8_config']!r}; use 'E4M3' or 'E5M2'.")
        path = _emulated_file(config["dump_stats_path"])
        amax = _load_measurements(path, config["dump_stats_path"])
        layers = dict(_linear_layers(module, config))
        if unmeasured := sorted(layers.keys() - amax.keys()):
            raise ValueError(
                f"The FP8 measurements at {path!r} have no input range for {unmeasured}: measure with batches"
                " that run these layers (or this model), or put them in the blocklist."
            )
        new = {id(layer): _FP8InferenceLinear.from_linear(layer, fmt, amax[name]) for name, layer in layers.items()}
        for name, child in list(module.named_modules(remove_duplicate=False)):  # every path to a shared layer
            if name and id(child) in new:
                parent, _, attribute = name.rpartition(".")
                setattr(module.get_submodule(parent), attribute, new[id(child)])
        return module


def _load_measurements(path: str, stats_path: str) -> dict[str, float]:
    if not os.path.isfile(path):
        found = ", ".join(_measurements(stats_path)) or "none"
        raise FileNotFoundError(
            f"FP8 inference mode='quantize' found no measurements for this rank at {path!r} (files found: {found}):"
            " quantize with as many ranks as measured, or measure again with mode='measure' and the same stats_path."
        )
    try:
        amax = torch.load(path, weights_only=True)
        if not isinstance(amax, dict) or not all(isinstance(v, float) for v in amax.values()):
            raise ValueError(f"a {type(amax).__name__}, not a dict of layer names to ranges")
    except Exception as err:  # torch's own text (a zip reader's, or advice to unpickle anything) would mislead
        detail = str(err) if isinstance(err, ValueError) else type(err).__name__
        raise ValueError(
            f"The FP8 measurements file {path!r} is damaged or not one the measure run wrote ({detail}). Measure"
            " again: run with mode='measure' and the same stats_path."
        ) from err
    return amax


def _linear_layers(module: nn.Module, config: Mapping[str, Any]) -> list[tuple[str, nn.Linear]]:
    blocked = config.get("blocklist") or {}
    names, types = blocked.get("names", ()), blocked.get("types", ())
    layers = [(name, layer) for name, layer in module.named_modules() if name and isinstance(layer, nn.Linear)]
    return [(n, m) for n, m in layers if type(m).__name__ not in types and not any(b in n for b in names)]


class _FP8InferenceLinear(nn.Linear):
    """``nn.Linear`` (sharing the Parameters) with input and weight through ``fmt`` at fixed scales."""

    input_scale: Tensor
    weight_scale: Tensor
    fmt: FP8Format

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: FP8Format, input_amax: float) -> _FP8InferenceLinear:
        layer = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        layer.weight, layer.bias, layer.fmt = linear.weight, linear.bias, fmt
        one, weight_amax = torch.ones((), device=linear.weight.device), linear.weight.detach().abs().max().float()
        layer.register_buffer("input_scale", scale_from_amax(one * input_amax, fmt, 0, one), persistent=False)
        layer.register_buffer("weight_scale", scale_from_amax(weight_amax, fmt, 0, one), persistent=False)
        return layer.train(linear.training)

    @override
    def forward(self, input: Tensor) -> Tensor:
        x = quantize_dequantize(input, self.input_scale, self.fmt).to(input.dtype)
        weight = quantize_dequantize(self.weight, self.weight_scale, self.fmt).to(self.weight.dtype)
        return F.linear(x, weight, self.bias)
