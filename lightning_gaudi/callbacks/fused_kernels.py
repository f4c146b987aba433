"""Routes a model's attention, RMSNorm and rotary embeddings to Gaudi's fused kernels through the seam."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.callbacks.inference import _plain_forward

#: The dtypes Gaudi's fused kernels take (Intel's guide, for FusedSDPA); others run torch's op.
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _standard_rope(module: Any) -> bool:
    """Whether a ``modeling_*`` module's ``apply_rotary_pos_emb(q, k, cos, sin)`` is the rotate-half RoPE (LLaMA's),
    checked by what it computes on small random inputs against the seam's reference math."""
    apply = getattr(module, "apply_rotary_pos_emb", None)
    if not callable(apply):
        return False
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 3, 4, generator=generator) for _ in range(2))
    cos, sin = (torch.randn(1, 3, 4, generator=generator) for _ in range(2))
    try:
        got = apply(q, k, cos, sin)
    except Exception:  # another signature or contract: not this RoPE
        return False
    half = q.shape[-1] // 2
    expected = [x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin[:, None] for x in (q, k)]
    if not (isinstance(got, tuple) and len(got) == 2):
        return False
    pairs = zip(got, expected, strict=True)
    return all(isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a, b) for a, b in pairs)


def _hf_rms_norm(module: nn.Module) -> bool:
    """A Hugging Face ``*RMSNorm``: a 1-D ``weight``, a float ``variance_epsilon`` and ``forward(hidden_states)``."""
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    named = type(module).__name__.endswith("RMSNorm") and type(module).forward.__code__.co_argcount == 2
    return named and isinstance(weight, nn.Parameter) and weight.dim() == 1 and isinstance(eps, float)


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


class _Kernels(TorchFunctionMode):
    """Entered around each step's forward: sends ``F.scaled_dot_product_attention`` and ``F.rms_norm`` to the seam."""

    def __init__(self, callback: FusedKernels) -> None:
        super().__init__()
        self.cb = callback

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self.cb.sdpa:
            return self.cb._sdpa(*args, **kwargs)
        if func is F.rms_norm and self.cb.rms_norm:
            return self.cb._torch_rms_norm(*args, **kwargs)
        return func(*args, **kwargs)


class _RMSNormForward:
    """A Hugging Face RMSNorm's ``forward`` through the seam, set on the module until teardown (no new keys)."""

    def __init__(self, callback: FusedKernels, module: nn.Module) -> None:
        self.cb, self.module = callback, module

    def __call__(self, hidden_states: Tensor) -> Tensor:
        module = self.module
        return self.cb._rms(hidden_states, module.weight, module.variance_epsilon, module)  # type: ignore[arg-type]

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        module = memo.get(id(self.module))
        return self if module is None else _RMSNormForward(self.cb, module)

    def __reduce__(self) -> tuple[Any, ...]:
        return _plain_forward, (self.module,)  # a pickle of the module loads with its plain forward


class FusedKernels(Callback):
    """Runs the model's attention, RMSNorm and RoPE on Gaudi's FusedSDPA, FusedRMSNorm and FusedRoPE through the seam
    (:class:`~lightning_gaudi.hpu.Backend`'s ``sdpa``/``rms_norm``/``rope``; in emulation, the model's own math).

    In the forward context, a ``TorchFunctionMode`` routes ``F.scaled_dot_product_attention`` and ``F.rms_norm``;
    Hugging Face's LLaMA-style ``apply_rotary_pos_emb`` is swapped and its ``*RMSNorm`` modules get a ``forward``
    attribute until teardown (checkpoints keep their keys). A call a kernel cannot take (not float32/bfloat16, a mask
    not shaped ``(N, ..., L or 1, S)``, batch broadcasting in recompute mode) runs torch's op, warned once.

    Args:
        sdpa: route attention to FusedSDPA.
        sdpa_recompute: FusedSDPA's recompute mode (less memory); ``False`` keeps the forward's intermediates.
        rms_norm: route RMSNorm to FusedRMSNorm.
        rope: route rotary embeddings to FusedRoPE.
    """

    _backend: hpu.Backend  # set up with the Trainer

    def __init__(
        self, sdpa: bool = True, sdpa_recompute: bool = True, rms_norm: bool = True, rope: bool = True
    ) -> None:
        for name, value in {"sdpa": sdpa, "sdpa_recompute": sdpa_recompute, "rms_norm": rms_norm, "rope": rope}.items():
            if not isinstance(value, bool):
                raise TypeError(f"FusedKernels({name}={value!r}) must be True or False.")
        self.sdpa, self.sdpa_recompute, self.rms_norm, self.rope = sdpa, sdpa_recompute, rms_norm, rope
        self._fallbacks: set[str] = set()
        self._warned: set[str] = set()
        self._forwards: list[nn.Module] = []
        self._ropes: dict[Any, Callable[..., Any]] = {}
        self._precision: Any = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._precision is not None:
            return
        self._backend = hpu.get_backend()
        for module in pl_module.modules():
            if self.rms_norm and _hf_rms_norm(module) and "forward" not in vars(module):
                self._forwards.append(module)
                module.forward = _RMSNormForward(self, module)  # type: ignore[method-assign]
            source = sys.modules.get(type(module).__module__)
            if self.rope and source not in self._ropes and _standard_rope(source):
                self._ropes[source] = functools.partial(self._rope_pair, source.apply_rotary_pos_emb)  # type: ignore[union-attr]
        self._precision = trainer.strategy.precision_plugin
        plain = self._precision.forward_context
        self._precision.forward_context = functools.partial(self._forward_context, plain)

    @contextlib.contextmanager
    def _forward_context(self, plain: Callable[[], Any]) -> Iterator[None]:
        saved = {source: source.apply_rotary_pos_emb for source in self._ropes}
        try:
            for source, routed in self._ropes.items():
                source.apply_rotary_pos_emb = routed
            with plain(), _Kernels(self):
                yield
        finally:
            for source, original in saved.items():
                source.apply_rotary_pos_emb = original

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:  # fmt: skip
        torch_sdpa = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask, dropout_p, is_causal)
        if torch.is_autocast_enabled(q.device.type):  # torch's autocast runs attention in the lower precision
            dtype = torch.get_autocast_dtype(q.device.type)
            q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
        if enable_gqa and k.size(-3) != q.size(-3):  # FusedSDPA has no grouped-query flag: repeat the kv heads
            if q.size(-3) % k.size(-3) or q.size(-3) % v.size(-3):
                return torch_sdpa(scale=scale, enable_gqa=enable_gqa)  # torch's error says what is wrong
            k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), dim=-3) for t in (k, v))
        reason = _sdpa_refusal(q, k, v, attn_mask, self.sdpa_recompute)
        if reason is not None:
            self._fallbacks.add(reason)
            return torch_sdpa(scale=scale, enable_gqa=enable_gqa)
        return self._backend.sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, recompute=self.sdpa_recompute)

    def _rms(self, x: Tensor, weight: Tensor, eps: float, module: nn.Module) -> Tensor:
        if x.dtype not in KERNEL_DTYPES or weight.dtype not in KERNEL_DTYPES:
            self._fallbacks.add(f"RMSNorm in {x.dtype} with a {weight.dtype} weight (FusedRMSNorm: float32, bfloat16)")
            return type(module).forward(module, x)  # type: ignore[no-any-return]
        return self._backend.rms_norm(x, weight, eps)

    def _torch_rms_norm(self, x: Tensor, shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
        if weight is None or len(shape) != 1 or x.dtype not in KERNEL_DTYPES or weight.dtype != x.dtype:
            self._fallbacks.add("F.rms_norm without a weight, over several dimensions or in mixed or other dtypes")
            return F.rms_norm(x, shape, weight, eps)
        return self._backend.rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)

    def _rope_pair(self, original: Callable[..., Any], q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                   unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:  # fmt: skip
        dtypes = {torch.promote_types(t.dtype, cos.dtype) for t in (q, k)}
        if not dtypes <= set(KERNEL_DTYPES) or sin.dtype != cos.dtype:
            self._fallbacks.add(f"rotary embeddings in {q.dtype}/{cos.dtype} (FusedRoPE takes float32 and bfloat16)")
            return original(q, k, cos, sin, unsqueeze_dim)  # type: ignore[no-any-return]
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return self._backend.rope(q, cos, sin), self._backend.rope(k, cos, sin)

    def _warn_fallbacks(self, *args: Any, **kwargs: Any) -> None:  # after the step: a warning breaks compiled graphs
        for reason in sorted(self._fallbacks - self._warned):
            rank_zero_warn(f"FusedKernels: {reason} runs torch's op instead of the fused kernel (said once).")
        self._warned |= self._fallbacks

    on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _warn_fallbacks

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "exception")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for module in self._forwards:
            vars(module).pop("forward", None)
        if self._precision is not None:
            vars(self._precision).pop("forward_context", None)
        self._forwards, self._ropes, self._precision = [], {}, None
