"""FP8 training for the plugins: Intel's ``te.Linear`` on a Gaudi, :class:`FP8Linear` in emulation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.fp8.convert import convert_linear_layers
from lightning_gaudi.fp8.linear import FP8Linear, fp8_autocast
from lightning_gaudi.fp8.recipe import FP8Recipe
from lightning_gaudi.precision import check_precision_supported


class FP8Training:
    """Converts models and opens the step context for FP8 training with ``recipe`` on ``backend`` (default: current)."""

    def __init__(self, recipe: FP8Recipe, backend: hpu.Backend | None = None) -> None:
        backend = backend or hpu.get_backend()
        check_precision_supported("fp8", backend)
        self.recipe = recipe
        self._autocast_device = backend.autocast_device_type
        self._engine = engine = backend.transformer_engine()
        settings = (recipe.format, recipe.margin, recipe.interval, recipe.amax_history_len, recipe.amax_compute_algo)
        self._bridge_recipe = None if engine is None else engine.delayed_scaling(*settings)
        self._layers: dict[str, nn.Module] = {}

    @property
    def emulated(self) -> bool:
        """Whether FP8 is emulated (:class:`~lightning_gaudi.fp8.linear.FP8Linear`) rather than Intel's."""
        return self._engine is None

    def convert(self, module: nn.Module) -> nn.Module:
        """Replaces ``module``'s linear layers whose shapes suit FP8 (in place) and says once what it did."""
        engine = self._engine
        if engine is None:
            make: Callable[[nn.Linear], nn.Module] = functools.partial(FP8Linear.from_linear, recipe=self.recipe)
            is_fp8, what = _is_emulated_fp8, f"emulated FP8 (FP8Linear, recipe {self.recipe.format})"
        else:
            make, is_fp8 = engine.linear, engine.is_fp8_module
            what = f"FP8 (Intel's te.Linear, recipe {self.recipe.format})"
        module, conversion = convert_linear_layers(module, make, is_fp8)
        self._layers = {name: layer for name, layer in module.named_modules() if is_fp8(layer)}  # each layer once
        if not self._layers:
            rank_zero_warn(
                f"{conversion.summary(what)} precision='fp8' computes nothing in FP8 for this model: it has no"
                " nn.Linear layer whose in and out features are multiples of 16."
            )
        elif conversion.layers:  # set up again (another fit, validate...): said already
            rank_zero_info(conversion.summary(what))
        return module

    def state_dict(self) -> dict[str, Any]:
        """The scaling state of the last converted model's FP8 layers, by layer name."""
        engine = self._engine
        if engine is None:
            return {name: layer.fp8_state() for name, layer in self._layers.items()}  # type: ignore[operator]
        return {name: engine.fp8_state(layer) for name, layer in self._layers.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned; raises ``ValueError`` for another model's layers."""
        if set(state_dict) != set(self._layers):
            raise ValueError(
                f"The checkpoint holds FP8 scaling state for layers {sorted(state_dict)}, but this model's FP8 layers"
                f" are {sorted(self._layers)}. Resume with the model (and precision) the checkpoint was written with."
            )
        engine = self._engine
        for name, layer in self._layers.items():
            if engine is None:
                layer.load_fp8_state(state_dict[name])  # type: ignore[operator]
            else:
                engine.load_fp8_state(layer, state_dict[name])

    @contextmanager
    def forward_context(self) -> Iterator[None]:
        """The context a training, validation or prediction step runs in."""
        with ExitStack() as stack:
            if self._autocast_device is not None:
                stack.enter_context(torch.autocast(self._autocast_device, dtype=torch.bfloat16))
            if self._engine is None:
                stack.enter_context(fp8_autocast())
            else:
                stack.enter_context(self._engine.fp8_autocast(self._bridge_recipe))
            yield


def _is_emulated_fp8(module: nn.Module) -> bool:
    return isinstance(module, FP8Linear)
