"""Gaudi's fused attention, RMSNorm and rotary embeddings (FusedSDPA, FusedRMSNorm, FusedRoPE; the reference math in
emulation) as a model transformation: :func:`fuse_kernels` replaces modules by type."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_gaudi import hpu

_log = logging.getLogger(__name__)
_TRANSFORMERS = RequirementCache("transformers")

#: The dtypes Gaudi's fused kernels take (Intel's guide, for FusedSDPA); others run torch's op.
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class Kernels:
    """The backend's fused kernels with :class:`~lightning_gaudi.callbacks.FusedKernels`' flags; a call they cannot
    take runs torch's op (warned once per reason)."""

    def __init__(
        self,
        sdpa: bool = True,
        sdpa_recompute: bool = True,
        rms_norm: bool = True,
        rope: bool = True,
        backend: hpu.Backend | None = None,
    ) -> None:
        self.check_flags(sdpa=sdpa, sdpa_recompute=sdpa_recompute, rms_norm=rms_norm, rope=rope)
        self.sdpa_enabled = sdpa
        self.sdpa_recompute = sdpa_recompute
        self.rms_norm_enabled = rms_norm
        self.rope_enabled = rope
        self.backend = backend or hpu.get_backend()
        self._pending: set[str] = set()
        self._warned: set[str] = set()

    def __deepcopy__(self, memo: dict[int, Any]) -> Kernels:
        return self  # flags and the seam, no tensors: a copied model shares them

    def __reduce__(self) -> tuple[Any, ...]:  # a pickled model loads with the seam of the process that loads it
        return Kernels, (self.sdpa_enabled, self.sdpa_recompute, self.rms_norm_enabled, self.rope_enabled)

    @staticmethod
    def check_flags(**flags: Any) -> None:
        """Raises ``TypeError`` naming the first flag that is not a bool."""
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"FusedKernels({name}={value!r}) must be True or False.")

    def _fallback(self, reason: str) -> None:
        if reason not in self._warned:
            self._pending.add(reason)
            if not torch.compiler.is_compiling():  # a warning in a compiled graph breaks it: said after the step
                self.warn_fallbacks()

    def warn_fallbacks(self) -> None:
        """Warns once for each reason a call ran torch's op that was not warned about yet."""
        for reason in sorted(self._pending):
            rank_zero_warn(f"FusedKernels: {reason} runs torch's op instead of the fused kernel (said once).")
        self._warned |= self._pending
        self._pending = set()

    def sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Tensor:
        """``F.scaled_dot_product_attention`` on FusedSDPA; ``k`` and ``v`` may have fewer heads than ``q``."""
        if k.size(-3) != q.size(-3):
            if q.size(-3) % k.size(-3) or v.size(-3) != k.size(-3):  # torch's error says what is wrong
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True
                )
            k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), dim=-3) for t in (k, v))  # FusedSDPA has no GQA
        if torch.is_autocast_enabled(q.device.type):  # torch's autocast runs attention in the lower precision
            dtype = torch.get_autocast_dtype(q.device.type)
            q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
        reason = _sdpa_refusal(q, k, v, attn_mask, self.sdpa_recompute) if self.sdpa_enabled else None
        if reason is not None:
            self._fallback(reason)
        if reason is not None or not self.sdpa_enabled:
            return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)
        return self.backend.sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, recompute=self.sdpa_recompute)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm over the last dimension as Hugging Face's LLaMA computes it, on FusedRMSNorm."""
        if x.dtype not in KERNEL_DTYPES or weight.dtype not in KERNEL_DTYPES:
            self._fallback(f"RMSNorm in {x.dtype} with a {weight.dtype} weight (FusedRMSNorm: float32, bfloat16)")
            h = x.float()
            return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return self.backend.rms_norm(x, weight, eps)

    def rope(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotary embeddings ``x * cos + rotate_half(x) * sin`` of ``q`` and ``k`` on FusedRoPE."""
        dtypes = {torch.promote_types(t.dtype, cos.dtype) for t in (q, k)}
        if self.rope_enabled and dtypes <= set(KERNEL_DTYPES) and sin.dtype == cos.dtype:
            return self.backend.rope(q, cos, sin), self.backend.rope(k, cos, sin)
        if self.rope_enabled:
            self._fallback(f"rotary embeddings in {q.dtype}/{cos.dtype} (FusedRoPE takes float32 and bfloat16)")
        half = q.shape[-1] // 2
        rotated = [torch.cat((-x[..., half:], x[..., :half]), dim=-1) for x in (q, k)]
        return q * cos + rotated[0] * sin, k * cos + rotated[1] * sin


def _sdpa_refusal(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, recompute: bool) -> str | None:
    """Why FusedSDPA cannot take these arguments (Intel's guide), or ``None``."""
    if q.dtype not in KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"attention in {q.dtype}/{k.dtype}/{v.dtype} (FusedSDPA takes float32 or bfloat16)"
    if q.dim() != 4:
        return f"attention on a {q.dim()}-D query (FusedSDPA takes (N, H, L, E))"
    if recompute and not q.size(0) == k.size(0) == v.size(0):
        return "attention broadcasting the batch (FusedSDPA's recompute mode cannot)"
    if mask is not None and (mask.dim() != 4 or mask.size(0) != q.size(0) or mask.size(-2) not in (1, q.size(-2))):
        return f"an attention mask of shape {tuple(mask.shape)} (FusedSDPA takes (N, ..., L or 1, S))"
    return None


class FusedRMSNorm(nn.Module):
    """RMSNorm on FusedRMSNorm with the replaced module's ``weight``; ``hf_style``: LLaMA's math, else torch's."""

    def __init__(self, weight: nn.Parameter, eps: float | None, kernels: Kernels, hf_style: bool) -> None:
        super().__init__()
        self.weight = weight
        self.eps, self.hf_style = eps, hf_style
        self._kernels = (kernels,)  # in a tuple: not a submodule, nothing in the state dict

    @classmethod
    def from_module(cls, module: nn.Module, kernels: Kernels) -> nn.Module:
        """From ``torch.nn.RMSNorm`` over one dimension with a weight, or a LLaMA-style module; else ``module``."""
        if not kernels.rms_norm_enabled:
            return module
        if isinstance(module, nn.RMSNorm):
            if module.weight is None or len(module.normalized_shape) != 1:
                return module
            return cls(module.weight, module.eps, kernels, hf_style=False)
        return cls(module.weight, module.variance_epsilon, kernels, hf_style=True)  # type: ignore[arg-type]

    def forward(self, x: Tensor) -> Tensor:
        kernels = self._kernels[0]
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        if self.hf_style:
            return kernels.rms_norm(x, self.weight, eps)
        if x.dtype != self.weight.dtype:
            kernels._fallback(f"torch.nn.RMSNorm on {x.dtype} with a {self.weight.dtype} weight")
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return kernels.rms_norm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, hf_style={self.hf_style}"


class FusedLlamaAttention(nn.Module):
    """Hugging Face's LLaMA attention on FusedRoPE and FusedSDPA, holding the replaced module's projections (the same
    state-dict keys) and taking its call."""

    def __init__(self, attention: nn.Module, kernels: Kernels) -> None:
        super().__init__()
        self.config, self.layer_idx = attention.config, attention.layer_idx
        self.head_dim: int = attention.head_dim  # type: ignore[assignment]
        self.scaling: float = attention.scaling  # type: ignore[assignment]
        self.attention_dropout: float = attention.attention_dropout  # type: ignore[assignment]
        self.is_causal: bool = getattr(attention, "is_causal", True)
        self.q_proj: nn.Module = attention.q_proj  # type: ignore[assignment]
        self.k_proj: nn.Module = attention.k_proj  # type: ignore[assignment]
        self.v_proj: nn.Module = attention.v_proj  # type: ignore[assignment]
        self.o_proj: nn.Module = attention.o_proj  # type: ignore[assignment]
        self._kernels = (kernels,)

    @classmethod
    def from_module(cls, module: nn.Module, kernels: Kernels) -> nn.Module:
        """The fused attention holding ``module``'s projections (``module`` itself with neither SDPA nor RoPE)."""
        return cls(module, kernels) if kernels.sdpa_enabled or kernels.rope_enabled else module

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        attention_mask: Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        kernels = self._kernels[0]
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(hidden_states).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = position_embeddings
        q, k = kernels.rope(q, k, cos.unsqueeze(1), sin.unsqueeze(1))
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        causal = q.size(2) > 1 and attention_mask is None and self.is_causal
        if causal and k.size(2) > q.size(2):  # prefill of an empty static cache: as transformers' sdpa path
            k, v = k[:, :, : q.size(2)], v[:, :, : q.size(2)]
        dropout = self.attention_dropout if self.training else 0.0
        out = kernels.sdpa(q, k, v, attention_mask, dropout, causal, self.scaling)
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1).contiguous()
        return self.o_proj(out), None


#: What replaces a module: ``factory(module, kernels)``; returning ``module`` keeps it.
Factory = Callable[[nn.Module, Kernels], nn.Module]


def default_mapping() -> dict[type[nn.Module], Factory]:
    """``torch.nn.RMSNorm`` and, where ``transformers`` is installed, Hugging Face LLaMA's RMSNorm and attention."""
    mapping: dict[type[nn.Module], Factory] = {nn.RMSNorm: FusedRMSNorm.from_module}
    if _TRANSFORMERS:
        from transformers.models.llama import modeling_llama

        mapping[modeling_llama.LlamaRMSNorm] = FusedRMSNorm.from_module
        mapping[modeling_llama.LlamaAttention] = FusedLlamaAttention.from_module
    return mapping


@dataclass
class KernelReport:
    """What :func:`fuse_kernels` replaced (``"LlamaRMSNorm -> FusedRMSNorm"``: how many) and the ``Kernels``."""

    kernels: Kernels
    replaced: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line: the replacements and counts."""
        if not self.replaced:
            return "Fused kernels: no module of a mapped type; the model is unchanged."
        return "Fused kernels: " + ", ".join(f"{n} x {what}" for what, n in sorted(self.replaced.items())) + "."


def fuse_kernels(
    model: nn.Module,
    mapping: Mapping[type[nn.Module], Factory] | None = None,
    *,
    sdpa: bool = True,
    sdpa_recompute: bool = True,
    rms_norm: bool = True,
    rope: bool = True,
) -> KernelReport:
    """Replaces, in place, each submodule of ``model`` whose exact type is a key of ``mapping`` with what its factory
    returns (the state dict keeps its keys). Run it before ``fabric.setup(model)``; the Trainer's is ``FusedKernels``.

    Args:
        model: the model; its own type is not replaced.
        mapping: module type -> ``factory(module, kernels)``; :func:`default_mapping` when ``None``.
        sdpa, sdpa_recompute, rms_norm, rope: as :class:`~lightning_gaudi.callbacks.FusedKernels`'.

    Raises:
        TypeError: a flag that is not a bool, or a mapping key that is not a module type.
    """
    kernels = Kernels(sdpa, sdpa_recompute, rms_norm, rope)
    mapping = default_mapping() if mapping is None else dict(mapping)
    for key in mapping:
        if not (isinstance(key, type) and issubclass(key, nn.Module)):
            raise TypeError(f"fuse_kernels(mapping=...): keys are nn.Module types, got {key!r}.")
    report = KernelReport(kernels)
    fused = sum(isinstance(m, FusedRMSNorm | FusedLlamaAttention) for m in model.modules())
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            factory = mapping.get(type(child))
            if factory is not None and (new := factory(child, kernels)) is not child:
                parent.register_module(name, new)
                report.replaced[f"{type(child).__name__} -> {type(new).__name__}"] += 1
    rank_zero_info(
        report.summary() if report.replaced or not fused else f"Fused kernels: {fused} modules fused already."
    )
    return report
