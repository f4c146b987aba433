"""The FP8 recipe: formats and delayed scaling, one to one with the bridge's ``recipe.DelayedScaling``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from lightning_gaudi.fp8.formats import E4M3, E5M2, FP8Format

Format = Literal["hybrid", "e4m3"]
AmaxComputeAlgo = Literal["max", "most_recent"]
FORMATS: tuple[str, ...] = ("hybrid", "e4m3")
AMAX_COMPUTE_ALGOS: tuple[str, ...] = ("max", "most_recent")


@dataclass(frozen=True)
class FP8Recipe:
    """Delayed per-tensor scaling (``scale = format max / amax / 2**margin``), as Transformer Engine's.

    Attributes:
        format: ``"hybrid"`` (E4M3 forward, E5M2 gradients) or ``"e4m3"`` (E4M3 everywhere).
        amax_history_len, margin: steps of amax each scale remembers; powers of two of headroom.
        amax_compute_algo: ``"max"`` of the history, or its ``"most_recent"`` entry.
        interval: recompute the scales every this many steps.
    """

    format: Format = "hybrid"
    amax_history_len: int = 1024
    margin: int = 0
    amax_compute_algo: AmaxComputeAlgo = "max"
    interval: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or self.format.lower() not in FORMATS:
            raise ValueError(
                f"FP8Recipe got format={self.format!r}; use 'hybrid' (E4M3 forward, E5M2 gradients) or 'e4m3'"
                " (E4M3 everywhere)."
            )
        object.__setattr__(self, "format", self.format.lower())
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"FP8Recipe got amax_compute_algo={self.amax_compute_algo!r}; use 'max' or 'most_recent'.")
        for name, low in (("amax_history_len", 1), ("margin", 0), ("interval", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"FP8Recipe got {name}={value!r}; it must be an integer >= {low}.")

    @property
    def forward_format(self) -> FP8Format:
        """The format of inputs and weights: E4M3."""
        return E4M3

    @property
    def backward_format(self) -> FP8Format:
        """The format of output gradients: E5M2 under ``"hybrid"``, E4M3 under ``"e4m3"``."""
        return E5M2 if self.format == "hybrid" else E4M3

    def as_dict(self) -> dict[str, Any]:
        """The recipe's fields, by name."""
        return asdict(self)

    @classmethod
    def coerce(cls, value: FP8Recipe | Mapping[str, Any] | None) -> FP8Recipe:
        """``value`` as a recipe: itself, one made from a mapping of its fields, or the default (``None``)."""
        if value is None:
            return cls()
        if isinstance(value, FP8Recipe):
            return value
        if isinstance(value, Mapping):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(map(str, value)) - names)
            if unknown:
                raise ValueError(f"FP8Recipe has no field(s) {unknown}; its fields are {sorted(names)}.")
            return cls(**{str(key): item for key, item in value.items()})
        raise TypeError(f"An FP8 recipe must be an FP8Recipe or a mapping of its fields, not {type(value).__name__}.")
