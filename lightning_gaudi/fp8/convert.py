"""Swapping a model's ``nn.Linear`` layers (features in multiples of 16) for FP8 ones, keeping weights and keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

#: FP8 layers need ``in_features`` and ``out_features`` to be multiples of this.
FP8_MULTIPLE = 16


@dataclass
class Conversion:
    """What :func:`convert_linear_layers` did: the FP8 layers by first qualified name, and the layers skipped."""

    layers: dict[str, nn.Module] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def converted(self) -> list[str]:
        """The qualified names of the layers now in FP8."""
        return list(self.layers)

    def summary(self, what: str) -> str:
        """One line: how many layers run in FP8 (``what``: the FP8 layer's kind) and which were left alone."""
        line = f"FP8: {len(self.converted)} linear layer(s) run in {what}"
        if self.skipped:
            line += (
                f"; {len(self.skipped)} left in bf16 (in/out features not multiples of {FP8_MULTIPLE}):"
                f" {', '.join(self.skipped)}"
            )
        return line + "."


def fp8_compatible(linear: nn.Linear) -> bool:
    """Whether ``linear``'s shape suits FP8 matrix units (both dimensions multiples of :data:`FP8_MULTIPLE`)."""
    return linear.in_features % FP8_MULTIPLE == 0 and linear.out_features % FP8_MULTIPLE == 0


def convert_linear_layers(
    module: nn.Module, make: Callable[[nn.Linear], nn.Module], is_fp8: Callable[[nn.Module], bool]
) -> tuple[nn.Module, Conversion]:
    """Replaces, in place, each ``nn.Linear`` of ``module`` whose shape suits FP8 with ``make(layer)`` (a shared layer
    by one FP8 layer everywhere; ``is_fp8`` layers stay); returns the model (new if ``module`` itself was converted)."""
    conversion = Conversion()
    done: dict[int, nn.Module] = {}

    def replace(child: nn.Module, name: str) -> nn.Module:
        if id(child) in done:
            return done[id(child)]
        if is_fp8(child) or not isinstance(child, nn.Linear):
            return child
        if not fp8_compatible(child):
            conversion.skipped.append(f"{name or type(child).__name__} ({child.in_features} -> {child.out_features})")
            done[id(child)] = child
            return child
        done[id(child)] = new = make(child)
        conversion.layers[name or type(child).__name__] = new
        return new

    root = replace(module, "")
    for name, child in list(root.named_modules(remove_duplicate=False)):  # every path to a shared layer
        new = replace(child, name) if name else child
        if new is not child:
            parent_name, _, child_name = name.rpartition(".")
            setattr(root.get_submodule(parent_name), child_name, new)
    return root, conversion
