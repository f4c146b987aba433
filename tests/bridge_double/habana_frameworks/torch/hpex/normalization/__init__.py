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
    """``apply(data_in, gamma, eps, ...)``: ``gamma * data_in / sqrt(mean(data_in**2, -1) + eps)`` computed in
    float32, in ``data_in``'s dtype (which must be ``gamma``'s)."""

    @staticmethod
    def apply(data_in, gamma, eps, use_stages=True, bwd_mode=0, fast_math=False):
        _state.record("hpex.FusedRMSNorm.apply", eps=eps, dtype=data_in.dtype)
        if data_in.dtype != gamma.dtype:
            raise RuntimeError(f"FusedRMSNorm: input {data_in.dtype} and weight {gamma.dtype} differ")
        h = data_in.float()
        return gamma * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(data_in.dtype)
