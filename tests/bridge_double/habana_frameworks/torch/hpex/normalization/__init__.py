"""Test double of ``habana_frameworks.torch.hpex.normalization``."""

import _bridge_double_state as _state
import torch


class FusedClipNorm:
    def __init__(self, parameters, max_norm):
        _state.record("hpex.FusedClipNorm", max_norm=max_norm)
        self.max_norm = max_norm

    def clip_norm(self, parameters):
        _state.record("hpex.FusedClipNorm.clip_norm")
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, norm_type=2.0)
