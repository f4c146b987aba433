"""The amp_unscaling patch (``lightning_gaudi/patches/amp_unscaling.py``): which optimizers Lightning leaves scaled.

The canaries fail when Lightning stops skipping (or refusing to clip) the optimizers that unscale in ``step()``, or
when torch's ``GradScaler`` stops handing such an optimizer the inf check after an explicit ``unscale_``.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi.patches import amp_unscaling, registry


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


def test_installed_after_import() -> None:
    assert amp_unscaling.installed()
    assert amp_unscaling.PATCH.installed()


def test_lightning_still_asks_and_refuses() -> None:
    """Canary: Lightning's fp16 plugin asks its predicate, and refuses to clip a fused optimizer."""
    assert amp_unscaling.missing_targets() == [], (
        f"Lightning no longer decides unscaling with {amp_unscaling.PREDICATE}: re-check patches/amp_unscaling.py"
    )
    fused = torch.optim.AdamW(_params(), fused=True)
    with pytest.raises(RuntimeError, match="fused"):
        MixedPrecision("16-mixed", device="cpu").clip_gradients(fused, 1.0)


def test_fused_optimizers_unscale_in_step_and_others_do_not() -> None:
    assert amp_unscaling.unscales_in_step(torch.optim.AdamW(_params(), fused=True))
    assert amp_unscaling.unscales_in_step(torch.optim.SGD(_params(), lr=0.1, fused=True))
    assert not amp_unscaling.unscales_in_step(torch.optim.AdamW(_params()))
    assert not amp_unscaling.unscales_in_step(torch.optim.AdamW(_params(), foreach=False))


@pytest.mark.parametrize("poisoned", [False, True])
def test_torch_skips_a_fused_step_with_inf_after_an_explicit_unscale(poisoned: bool) -> None:
    """Canary: what HPUPrecision relies on from torch's GradScaler after it unscales a fused optimizer itself."""
    params = _params()
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.tensor(1.0))  # the scaler makes its scale on first use
    params[0].grad = torch.full((3,), 8.0)
    if poisoned:
        params[0].grad[1] = float("inf")
    scaler.unscale_(optimizer)
    torch.testing.assert_close(params[0].grad[0], torch.tensor(2.0))
    scaler.step(optimizer)
    scaler.update()
    if poisoned:
        torch.testing.assert_close(params[0].detach(), torch.ones(3), rtol=0, atol=0)
        assert scaler.get_scale() == 2.0
    else:
        assert bool((params[0] < 1.0).all()), "the step ran on the unscaled gradients"
        assert scaler.get_scale() == 4.0


def test_unsupported_lightning_warns_and_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(amp_unscaling._State, "enabled", False)
    with pytest.warns(UserWarning, match="fused optimizers cannot be clipped"):
        assert amp_unscaling.install() is False
    with pytest.raises(RuntimeError, match="only on lightning"):
        amp_unscaling.unscales_in_step(torch.optim.AdamW(_params(), fused=True))
