"""The Trainer's FP8 precision plugin for HPUs."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from torch import nn
from typing_extensions import override

from lightning_gaudi.fp8.recipe import FP8Recipe
from lightning_gaudi.fp8.training import FP8Training


class HPUFP8Precision(Precision):
    """FP8 training on Gaudi 2 and later, emulated on the CPU elsewhere.

    ``Trainer(accelerator="hpu", precision="fp8")`` builds it with the default recipe; pass an instance for another::

        Trainer(accelerator="hpu", plugins=[HPUFP8Precision(recipe=FP8Recipe(amax_history_len=16))])

    The model's ``nn.Linear`` layers whose in and out features are multiples of 16 compute in FP8 (E4M3 forward,
    E5M2 gradients under the "hybrid" recipe, delayed per-tensor scales); the others, and every other op, run under
    bf16 autocast. On a Gaudi the layers become Intel's ``te.Linear`` and steps run under its ``fp8_autocast``; under
    emulation they become :class:`~lightning_gaudi.fp8.FP8Linear`, whose numerics follow the same recipe (slower than
    bf16 there: the point is checking convergence before the hardware). Weights stay float32 parameters, shared with
    the original layers, under ``nn.Linear``'s state-dict keys: checkpoints load into the model with or without FP8.
    The FP8 scaling state (amax histories, scales) is this plugin's state, which the Trainer saves in its
    checkpoints beside the model and restores on resume.

    Args:
        recipe: an :class:`~lightning_gaudi.fp8.FP8Recipe`, a mapping of its fields, or ``None`` for the default.

    Raises:
        ValueError: first-generation Gaudi (no FP8), or a bad recipe.
    """

    precision = "fp8"  # type: ignore[assignment]

    def __init__(self, recipe: FP8Recipe | Mapping[str, Any] | None = None) -> None:
        self.recipe = FP8Recipe.coerce(recipe)
        self._fp8 = FP8Training(self.recipe)

    @override
    def convert_module(self, module: nn.Module) -> nn.Module:
        return self._fp8.convert(module)

    @override
    def forward_context(self) -> AbstractContextManager[None]:
        return self._fp8.forward_context()

    @override
    def state_dict(self) -> dict[str, Any]:
        return self._fp8.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._fp8.load_state_dict(state_dict)
