"""Test double of ``habana_frameworks.torch.hpex.experimental.transformer_engine.recipe``."""

import enum

import _bridge_double_state as _state


class Format(enum.Enum):
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"


class DelayedScaling:
    def __init__(
        self,
        margin=0,
        interval=1,
        fp8_format=Format.HYBRID,
        amax_history_len=1024,
        amax_compute_algo="max",
        scaling_factor_compute_algo=None,
        override_linear_precision=(False, False, False),
    ):
        _state.record(
            "te.recipe.DelayedScaling",
            margin=margin,
            interval=interval,
            fp8_format=fp8_format,
            amax_history_len=amax_history_len,
            amax_compute_algo=amax_compute_algo,
        )
        self.margin = margin
        self.interval = interval
        self.fp8_format = fp8_format
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.scaling_factor_compute_algo = scaling_factor_compute_algo
        self.override_linear_precision = override_linear_precision
