"""Test double of ``habana_frameworks.torch.hpex.optimizers``: torch's optimizers under the bridge's names."""

import _bridge_double_state as _state
import torch
from torch.optim.optimizer import required


class FusedAdamW(torch.optim.AdamW):
    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.0,
        bias_correction=True,
        moments_dtype=None,
    ):
        params = list(params)
        _state.record(
            "hpex.FusedAdamW",
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            moments_dtype=moments_dtype,
        )
        if any(isinstance(group, dict) and not list(group["params"]) for group in params):
            raise RuntimeError("FusedAdamW: empty parameter group")  # the real kernel crashes on these
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class FusedSGD(torch.optim.SGD):
    def __init__(self, params, lr=required, momentum=0, weight_decay=0, dampening=0, nesterov=False):
        _state.record(
            "hpex.FusedSGD",
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            dampening=dampening,
            nesterov=nesterov,
        )
        super().__init__(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov
        )
