"""An emulated FP8 Linear: Transformer Engine's numerics on any device, for checking convergence without a Gaudi
(docs/strategies.md, "FP8")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from lightning_gaudi.fp8.formats import FP8Format, dequantize, quantize, scale_from_amax
from lightning_gaudi.fp8.recipe import FP8Recipe

#: Rows of ``fp8_amax_history`` and entries of ``fp8_scale``: the input, the weight, the output gradient.
INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2
#: The scaling state of an FP8Linear: buffers kept out of its state dict (see :meth:`FP8Linear.fp8_state`).
STATE_KEYS = ("fp8_amax_history", "fp8_scale", "fp8_steps")


class _Autocast:
    depth = 0


@contextmanager
def fp8_autocast(enabled: bool = True) -> Iterator[None]:
    """Runs :class:`FP8Linear` layers in (emulated) FP8 inside the block, like the bridge's ``te.fp8_autocast``."""
    previous = _Autocast.depth
    _Autocast.depth = previous + 1 if enabled else 0
    try:
        yield
    finally:
        _Autocast.depth = previous


def is_fp8_enabled() -> bool:
    """Whether :func:`fp8_autocast` is on here."""
    return _Autocast.depth > 0


def _update(
    history: Tensor, scale: Tensor, rows: slice, amax: Tensor, fmt: FP8Format, recipe: FP8Recipe, due: Tensor
) -> None:
    """Pushes this step's ``amax`` in front of the histories of ``rows`` and, when ``due``, recomputes their scales
    from the histories, in place (zero_ then add_: Lazy Tensor Core has no kernel for copy_, it would use the host)."""
    pushed = torch.cat((amax.unsqueeze(1), history[rows, :-1]), dim=1)
    pushed = torch.cat((history[: rows.start], pushed, history[rows.stop :]))
    history.zero_().add_(pushed)
    amax = history[rows].max(dim=1).values if recipe.amax_compute_algo == "max" else history[rows, 0]
    fresh = scale_from_amax(amax, fmt, recipe.margin, scale[rows])
    weight = due.to(scale.dtype)
    updated = torch.cat((scale[: rows.start], fresh * weight + scale[rows] * (1.0 - weight), scale[rows.stop :]))
    scale.zero_().add_(updated)


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        scale: Tensor,
        history: Tensor,
        steps: Tensor,
        recipe: FP8Recipe,
        update: bool,
    ) -> Tensor:
        used = scale.detach().clone()  # the buffer changes below; backward needs this step's scales
        fwd = recipe.forward_format
        xq = quantize(x, used[INPUT], fwd)
        wq = quantize(weight, used[WEIGHT], fwd)
        x_dq = dequantize(xq, used[INPUT])
        w_dq = dequantize(wq, used[WEIGHT])
        out = F.linear(x_dq, w_dq, None if bias is None else bias.float())
        due = steps.remainder(recipe.interval) == 0
        if update:
            with torch.no_grad():
                amax = torch.stack((x.detach().abs().max().float(), weight.detach().abs().max().float()))
                _update(history, scale, slice(INPUT, WEIGHT + 1), amax, fwd, recipe, due)
                steps.add_(1)
        ctx.save_for_backward(xq, wq, used)
        ctx.state = (scale, history, recipe, update, due)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        device = x.device.type
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        return out.to(torch.get_autocast_dtype(device) if autocast else x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xq, wq, used = ctx.saved_tensors
        scale, history, recipe, update, due = ctx.state
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        bwd = recipe.backward_format
        grad_scale = scale[GRAD_OUTPUT].detach().clone()
        g = dequantize(quantize(grad_output, grad_scale, bwd), grad_scale)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ dequantize(wq, used[WEIGHT])).to(x_dtype)
        if ctx.needs_input_grad[1]:
            x_dq = dequantize(xq, used[INPUT])
            grad_w = (g.reshape(-1, g.shape[-1]).t() @ x_dq.reshape(-1, x_dq.shape[-1])).to(w_dtype)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad_output.float().reshape(-1, grad_output.shape[-1]).sum(dim=0).to(b_dtype)
        if update:
            with torch.no_grad():
                amax = grad_output.detach().abs().max().float().reshape(1)
                _update(history, scale, slice(GRAD_OUTPUT, GRAD_OUTPUT + 1), amax, bwd, recipe, due)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class FP8Linear(nn.Linear):
    """``nn.Linear`` that, inside :func:`fp8_autocast`, quantises input and weight (in backward the output gradient)
    with delayed per-tensor scales and accumulates in float32; evaluation records nothing. ``recipe`` defaults to
    ``FP8Recipe()``; its scaling state is kept out of the state dict (:meth:`fp8_state`)."""

    fp8_amax_history: Tensor
    fp8_scale: Tensor
    fp8_steps: Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        recipe: FP8Recipe | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = recipe or FP8Recipe()
        self._init_fp8_state(self.weight.device)

    def _init_fp8_state(self, device: torch.device) -> None:
        length = self.recipe.amax_history_len
        self.register_buffer("fp8_amax_history", torch.zeros(3, length, device=device), persistent=False)
        self.register_buffer("fp8_scale", torch.ones(3, device=device), persistent=False)
        self.register_buffer("fp8_steps", torch.zeros((), dtype=torch.int64, device=device), persistent=False)

    def fp8_state(self) -> dict[str, Tensor]:
        """The scaling state (amax history, scales, steps), by buffer name, for a checkpoint."""
        return {name: getattr(self, name).detach().clone() for name in STATE_KEYS}

    def load_fp8_state(self, state: dict[str, Tensor]) -> None:
        """Restores what :meth:`fp8_state` returned; raises ``ValueError`` when it is not of this layer's shape."""
        for name in STATE_KEYS:
            buffer: Tensor = getattr(self, name)
            value = state.get(name)
            if not isinstance(value, Tensor) or value.shape != buffer.shape:
                shape = None if not isinstance(value, Tensor) else tuple(value.shape)
                raise ValueError(
                    f"The FP8 scaling state has {name} of shape {shape}; this layer's is {tuple(buffer.shape)} (its"
                    f" recipe's amax_history_len is {self.recipe.amax_history_len}). Resume with the same recipe."
                )
        with torch.no_grad():
            for name in STATE_KEYS:
                getattr(self, name).copy_(state[name])

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: FP8Recipe | None = None) -> FP8Linear:
        """An FP8Linear that shares ``linear``'s weight and bias Parameters (tied weights and optimizers keep them)."""
        layer = cls(linear.in_features, linear.out_features, bias=False, recipe=recipe, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer._init_fp8_state(linear.weight.device)
        layer.train(linear.training)
        return layer

    @override
    def forward(self, input: Tensor) -> Tensor:
        if not is_fp8_enabled():
            return super().forward(input)
        return _FP8LinearFunction.apply(
            input,
            self.weight,
            self.bias,
            self.fp8_scale,
            self.fp8_amax_history,
            self.fp8_steps,
            self.recipe,
            self.training,
        )

    @override
    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8_format={self.recipe.format}"
