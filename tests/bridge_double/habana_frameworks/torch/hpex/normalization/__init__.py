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


class FusedRMSNorm:
    """``apply(input, weight, eps)``: ``weight * input / sqrt(mean(input**2, -1) + eps)`` computed in float32, in
    ``input``'s dtype (which must be ``weight``'s)."""

    @staticmethod
    def apply(input, weight, eps, *args):
        _state.record("hpex.FusedRMSNorm.apply", eps=eps, dtype=input.dtype)
        if input.dtype != weight.dtype:
            raise RuntimeError(f"FusedRMSNorm: input {input.dtype} and weight {weight.dtype} differ")
        h = input.float()
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(input.dtype)
