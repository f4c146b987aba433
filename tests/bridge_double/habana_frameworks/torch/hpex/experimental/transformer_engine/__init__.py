"""Test double of ``habana_frameworks.torch.hpex.experimental.transformer_engine`` (Intel's Transformer Engine port).

Shaped as Intel documents it (docs.habana.ai, "FP8 Training with Intel Gaudi Transformer Engine") and as
optimum-habana and lightning-habana call it: ``te.Linear(in_features, out_features, bias=True, params_dtype=None,
skip_weight_param_allocation=False)``, ``te.fp8_autocast(enabled=False, calibrating=False, fp8_recipe=None,
fp8_group=None)``, the ``recipe`` module (``DelayedScaling``, ``Format``) and ``fp8.is_fp8_enabled()``. The double
cannot compute in FP8: ``Linear`` computes as ``nn.Linear`` and records, for each forward, whether FP8 was enabled.
Like Transformer Engine's modules it keeps FP8 metadata in ``get_extra_state()`` / ``set_extra_state()`` (saved as
``<layer>._extra_state``); the double's metadata is the count of FP8 forwards.
"""

import _bridge_double_state as _state
import torch
import torch.nn.functional as F

from . import fp8, recipe
from .fp8 import fp8_autocast

__all__ = ["Linear", "fp8", "fp8_autocast", "recipe"]


class Linear(torch.nn.Module):
    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        params_dtype=None,
        skip_weight_param_allocation=False,
        **kwargs,
    ):
        super().__init__()
        _state.record(
            "te.Linear",
            in_features,
            out_features,
            bias=bias,
            params_dtype=params_dtype,
            skip_weight_param_allocation=skip_weight_param_allocation,
        )
        self.in_features = in_features
        self.out_features = out_features
        dtype = params_dtype or torch.float32
        if skip_weight_param_allocation:
            self.weight = None
            self.bias = None
        else:
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
            torch.nn.init.normal_(self.weight, std=0.02)
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        self.fp8_forwards = 0

    def forward(self, inp, is_first_microbatch=None):
        enabled = fp8.is_fp8_enabled()
        _state.record("te.Linear.forward", fp8_enabled=enabled, recipe=fp8.get_fp8_recipe())
        self.fp8_forwards += int(enabled and self.training)
        return F.linear(inp, self.weight, self.bias)

    def get_extra_state(self):
        return {"fp8_forwards": self.fp8_forwards}

    def set_extra_state(self, state):
        _state.record("te.Linear.set_extra_state", state)
        self.fp8_forwards = state["fp8_forwards"]
