"""The Trainer's FP8 precision plugin for HPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from torch import nn

from lightning_gaudi.fp8.recipe import FP8Recipe
from lightning_gaudi.fp8.training import FP8Training


class FP8PrecisionCore(FP8Training):
    """The FP8 plugin's behaviour, shared by the Trainer's :class:`HPUFP8Precision` and Fabric's: the ``nn.Linear``
    layers converted, steps under FP8 autocast, the FP8 scaling state as the plugin's state."""

    precision = "fp8"

    def __init__(self, recipe: FP8Recipe | Mapping[str, Any] | None = None) -> None:
        super().__init__(FP8Recipe.coerce(recipe))

    def convert_module(self, module: nn.Module) -> nn.Module:
        return self.convert(module)


class HPUFP8Precision(FP8PrecisionCore, Precision):  # type: ignore[misc]
    """FP8 training on Gaudi 2 and later, emulated on the CPU elsewhere; ``precision="fp8"`` builds it with the default
    ``recipe`` (an :class:`~lightning_gaudi.fp8.FP8Recipe` or a mapping of its fields)."""
