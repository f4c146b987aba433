"""The emulated FP8 Linear against a reference quantise-dequantise computation, and its delayed scaling."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_gaudi.fp8 import E4M3, E5M2, FP8Linear, FP8Recipe, fp8_autocast, is_fp8_enabled
from lightning_gaudi.fp8.formats import quantize_dequantize


def _layer(recipe: FP8Recipe | None = None, seed: int = 0) -> FP8Linear:
    torch.manual_seed(seed)
    return FP8Linear.from_linear(nn.Linear(32, 16), recipe)


def _reference(x: Tensor, layer: FP8Linear, scale: Tensor) -> Tensor:
    return F.linear(
        quantize_dequantize(x, scale[0], E4M3), quantize_dequantize(layer.weight, scale[1], E4M3), layer.bias
    )


def test_forward_matches_the_reference_quantise_dequantise() -> None:
    layer = _layer()
    x = torch.randn(8, 32) * 3
    with fp8_autocast():
        for _ in range(3):  # a few steps, so the scales are no longer 1
            scale = layer.fp8_scale.clone()
            out = layer(x)
            torch.testing.assert_close(out, _reference(x, layer, scale), rtol=1e-6, atol=1e-6)
    assert not torch.equal(scale, torch.ones(3))
    plain = F.linear(x, layer.weight, layer.bias)
    assert (out - plain).abs().max() > 1e-3  # it really is quantised
    assert torch.linalg.vector_norm(out - plain) < 0.1 * torch.linalg.vector_norm(plain)  # and close


def test_outside_fp8_autocast_it_is_nn_linear() -> None:
    layer = _layer()
    x = torch.randn(4, 32)
    assert not is_fp8_enabled()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert layer.fp8_steps.item() == 0
    with fp8_autocast():
        assert is_fp8_enabled()
        with fp8_autocast(enabled=False):
            assert not is_fp8_enabled()
    assert not is_fp8_enabled()


def test_scales_follow_the_amax_history_and_margin() -> None:
    recipe = FP8Recipe(amax_history_len=3, margin=1)
    layer = _layer(recipe)
    x = torch.randn(4, 32)
    x = x / x.abs().max()  # amax 1
    w_amax = layer.weight.abs().max().item()
    seen: list[float] = []
    with fp8_autocast():
        for factor in (1.0, 4.0, 2.0, 0.5, 0.5, 0.5):
            used = layer.fp8_scale[0].item()
            expected = 1.0 if not seen else 448.0 / max(seen[-3:]) / 2
            assert used == expected, (seen, used)  # delayed: this step uses the history before it
            layer(x * factor)
            seen.append(factor)
        torch.testing.assert_close(layer.fp8_amax_history[0], torch.tensor([0.5, 0.5, 0.5]))
        assert layer.fp8_scale[0].item() == 448.0 / 0.5 / 2  # the 4 has left the window
        torch.testing.assert_close(layer.fp8_scale[1], torch.tensor(448.0 / w_amax / 2))
    assert layer.fp8_steps.item() == 6


def test_most_recent_and_interval() -> None:
    layer = _layer(FP8Recipe(amax_history_len=4, amax_compute_algo="most_recent", interval=2))
    x = torch.ones(2, 32)
    scales = []
    with fp8_autocast():
        for factor in (1.0, 8.0, 2.0, 4.0):
            layer(x * factor)
            scales.append(layer.fp8_scale[0].item())
    # recomputed on steps 0 and 2 only, from the most recent amax then
    assert scales == [448.0, 448.0, 224.0, 224.0]
    torch.testing.assert_close(layer.fp8_amax_history[0], torch.tensor([4.0, 2.0, 8.0, 1.0]))


def test_backward_quantises_output_gradients_to_e5m2() -> None:
    layer = _layer()
    x = torch.randn(8, 32, requires_grad=True)
    g = torch.randn(8, 16) * 1000
    g[0, 0] = 1e5  # beyond E5M2's range at scale 1: saturates to 57344
    with fp8_autocast():
        scale = layer.fp8_scale.clone()
        layer(x).backward(g)
    g_q = quantize_dequantize(g, torch.tensor(1.0), E5M2)
    assert g_q[0, 0].item() == 57344.0
    x_q = quantize_dequantize(x.detach(), scale[0], E4M3)
    w_q = quantize_dequantize(layer.weight.detach(), scale[1], E4M3)
    torch.testing.assert_close(x.grad, g_q @ w_q)
    torch.testing.assert_close(layer.weight.grad, g_q.t() @ x_q)
    torch.testing.assert_close(layer.bias.grad, g.sum(dim=0))  # the bias gradient stays in high precision
    # and the gradient's scale follows its amax for the next step
    assert layer.fp8_amax_history[2, 0].item() == 1e5
    torch.testing.assert_close(layer.fp8_scale[2], torch.tensor(57344.0 / 1e5))


def test_e4m3_recipe_quantises_gradients_to_e4m3() -> None:
    layer = _layer(FP8Recipe(format="e4m3"))
    x = torch.randn(2, 32, requires_grad=True)
    g = torch.full((2, 16), 1000.0)
    with fp8_autocast():
        layer(x).backward(g)
    w_q = quantize_dequantize(layer.weight.detach(), torch.tensor(1.0), E4M3)
    torch.testing.assert_close(x.grad, torch.full((2, 16), 448.0) @ w_q)  # saturated at E4M3's 448


def test_evaluation_records_nothing() -> None:
    layer = _layer()
    with fp8_autocast():
        layer(torch.randn(2, 32))
        state = {k: v.clone() for k, v in layer.state_dict().items()}
        layer.eval()
        with torch.no_grad():
            layer(torch.randn(2, 32) * 100)
    for key, value in layer.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_bf16_autocast_output_and_zero_input() -> None:
    layer = _layer()
    with fp8_autocast(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.zeros(2, 32))
    assert out.dtype == torch.bfloat16
    assert layer.fp8_scale[0].item() == 1.0  # amax 0: the scale is kept
    assert torch.isfinite(layer.fp8_scale).all()


def test_from_linear_shares_the_parameters() -> None:
    embedding = nn.Embedding(64, 32)
    head = nn.Linear(32, 64, bias=False)
    head.weight = embedding.weight  # tied, as in GPT
    layer = FP8Linear.from_linear(head)
    assert layer.weight is embedding.weight
    assert layer.bias is None
    assert layer.fp8_amax_history.shape == (3, 1024)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
