"""E4M3 and E5M2 as the formats define them, and per-tensor scaled quantisation."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_gaudi.fp8 import E4M3, E5M2
from lightning_gaudi.fp8.formats import dequantize, quantize, quantize_dequantize, scale_from_amax

ONE = torch.tensor(1.0)


def test_format_facts() -> None:
    assert (E4M3.max, E5M2.max) == (448.0, 57344.0)
    assert (E4M3.dtype, E5M2.dtype) == (torch.float8_e4m3fn, torch.float8_e5m2)


def test_e4m3_saturates_at_448() -> None:
    x = torch.tensor([447.0, 448.0, 464.0, 1e6, -1e6, math.inf, -math.inf])
    assert quantize_dequantize(x, ONE, E4M3).tolist() == [448.0, 448.0, 448.0, 448.0, -448.0, 448.0, -448.0]


def test_e5m2_saturates_at_57344_where_a_plain_cast_overflows() -> None:
    x = torch.tensor([57344.0, 1e5, -1e9, math.inf])
    assert torch.isinf(x[1:2].to(torch.float8_e5m2).float()).all()  # torch's cast alone: infinity
    assert quantize_dequantize(x, ONE, E5M2).tolist() == [57344.0, 57344.0, -57344.0, 57344.0]


def test_nan_stays_nan() -> None:
    for fmt in (E4M3, E5M2):
        assert torch.isnan(quantize_dequantize(torch.tensor([math.nan]), ONE, fmt)).all()


@pytest.mark.parametrize(
    ("fmt", "value", "stored"),
    [
        (E4M3, 1.1, 1.125),  # 3 mantissa bits: steps of 1/8 in [1, 2)
        (E5M2, 1.1, 1.0),  # 2 mantissa bits: steps of 1/4
        (E5M2, 1.2, 1.25),
        (E4M3, 2.0**-9, 2.0**-9),  # smallest E4M3 subnormal
        (E4M3, 2.0**-11, 0.0),
        (E5M2, 2.0**-16, 2.0**-16),  # smallest E5M2 subnormal: the wider range
        (E4M3, 240.0, 240.0),
        (E5M2, 49152.0, 49152.0),
    ],
)
def test_rounding_and_range(fmt, value: float, stored: float) -> None:
    assert quantize_dequantize(torch.tensor([value]), ONE, fmt).item() == stored


def test_scale_maps_values_into_range_and_back() -> None:
    x = torch.tensor([0.001, -0.002, 0.003])
    scale = torch.tensor(448.0 / 0.003)
    q = quantize(x, scale, E4M3)
    assert q.dtype == torch.float8_e4m3fn
    assert q.float().abs().max().item() == 448.0
    torch.testing.assert_close(dequantize(q, scale), x, rtol=2**-4, atol=0)
    # the same values unscaled are E4M3 subnormals (steps of 2**-9) and lose most of their precision
    assert (quantize_dequantize(x, ONE, E4M3) - x).abs().max() > (dequantize(q, scale) - x).abs().max() * 5
    # a scale too large saturates
    assert quantize_dequantize(torch.tensor([300.0]), torch.tensor(2.0), E4M3).item() == 224.0


def test_scale_from_amax_and_margin() -> None:
    previous = torch.tensor([7.0, 7.0, 7.0, 7.0, 7.0])
    amax = torch.tensor([2.0, 0.0, math.inf, math.nan, 1e-39])
    assert scale_from_amax(amax, E4M3, 0, previous).tolist() == [224.0, 7.0, 7.0, 7.0, 7.0]
    assert scale_from_amax(amax[:1], E4M3, 2, previous[:1]).item() == 56.0
    assert scale_from_amax(torch.tensor([4.0]), E5M2, 0, previous[:1]).item() == 14336.0
