"""Test double of ``habana_frameworks.torch.hpex.kernels``."""

import _bridge_double_state as _state
import torch.nn.functional as F


class FusedSDPA:
    @staticmethod
    def apply(
        q,
        k,
        v,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        softmax_mode="None",
        recompute_mode=None,
        valid_sequence_lengths=None,
        padding_side="left",
    ):
        _state.record(
            "hpex.FusedSDPA.apply",
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            softmax_mode=softmax_mode,
            recompute_mode=recompute_mode,
        )
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
