"""Test double of ``habana_frameworks.torch.hpex.kernels`` (signatures as in bridge 1.19, docs/conformance.md)."""

import _bridge_double_state as _state
import torch
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
        valid_seq_len=None,
        seq_padding_type="left",
        return_dropout_mask=False,
        return_attn_probs=False,
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
        if q.dtype not in (torch.float32, torch.bfloat16):  # Intel's guide: FP32 and BF16
            raise RuntimeError(f"FusedSDPA does not support {q.dtype}")
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )


class RotaryPosEmbeddingHelperV1:
    """``apply(p, cos, sin, offset)``: ``p * cos + rotate_half(p) * sin``, ``cos``/``sin`` broadcast to ``p`` from
    position ``offset`` on. Like the bridge, all three compute in float32 when any is float32, else ``cos`` and
    ``sin`` take ``p``'s dtype."""

    @staticmethod
    def apply(p, cos, sin, offset):
        _state.record("hpex.RotaryPosEmbeddingHelperV1.apply", offset=offset, dtype=p.dtype)
        if torch.float32 in (p.dtype, cos.dtype, sin.dtype):
            p, cos, sin = p.float(), cos.float(), sin.float()
        else:
            cos, sin = cos.to(p.dtype), sin.to(p.dtype)
        if offset:
            cos, sin = cos[..., offset:, :], sin[..., offset:, :]
        half = p.shape[-1] // 2
        return p * cos + torch.cat((-p[..., half:], p[..., :half]), dim=-1) * sin
