"""Canary of ``patches/module_forward.py``: a module's call runs a ``forward`` set on the instance, with its hooks,
and runs the class's again once put back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_gaudi.patches import module_forward


def test_the_instance_forward_runs_with_the_hooks_and_is_put_back() -> None:
    assert module_forward.missing_targets() == []
    linear = nn.Linear(2, 2)
    hooked: list[torch.Tensor] = []
    linear.register_forward_hook(lambda module, args, out: hooked.append(out))
    x = torch.ones(1, 2)
    expected = linear(x)
    previous = module_forward.set_forward(linear, lambda inputs: torch.zeros(1, 2))
    assert previous is None
    torch.testing.assert_close(linear(x), torch.zeros(1, 2))
    assert list(linear.state_dict()) == ["weight", "bias"]
    module_forward.restore_forward(linear, previous)
    torch.testing.assert_close(linear(x), expected)
    assert "forward" not in vars(linear)
    assert len(hooked) == 3


def test_a_torch_that_stopped_calling_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nn.Module, "__call__", lambda self, *args: type(self).forward(self, *args))
    with pytest.raises(RuntimeError, match="does not call a module's own forward"):
        module_forward.set_forward(nn.Identity(), lambda x: x)
