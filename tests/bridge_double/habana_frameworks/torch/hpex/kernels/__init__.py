"""Test double of ``habana_frameworks.torch.hpex.kernels``."""

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
        if q.dtype not in (torch.float32, torch.bfloat16):  # Intel's guide: FP32 and BF16
            raise RuntimeError(f"FusedSDPA does not support {q.dtype}")
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )


class RotaryPosEmbeddingHelperV1:
    """``apply(input, cos, sin, offset)``: ``input * cos + rotate_half(input) * sin``, ``cos``/``sin`` broadcast to
    ``input`` from position ``offset`` on (vLLM's HPU extension calls it with gathered ``cos``/``sin`` and 0)."""

    @staticmethod
    def apply(input, cos, sin, offset=0):
        _state.record("hpex.RotaryPosEmbeddingHelperV1.apply", offset=offset, dtype=input.dtype)
        if offset:
            cos, sin = cos[..., offset:, :], sin[..., offset:, :]
        half = input.shape[-1] // 2
        return input * cos + torch.cat((-input[..., half:], input[..., :half]), dim=-1) * sin
