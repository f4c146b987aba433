"""The dtypes a Gaudi holds in another one, float64 and int64, as Intel's bridge handles them, and the emulator's
imitation of the host-to-device copy. From gaudi-pytorch-bridge v1.19.0:

- **float64 is held in float32**, always, under the tensor's float64 dtype (backend/helpers/create_tensor.cpp:1068;
  habana_eager/ops/copy_from.cpp:217-219, 376-383): values lose precision, finite ones beyond float32 become infinite.
- **int64 is held in int32 unless int64 support is on** (``common::IsInt64Supported``: common/eager/utils.cpp:29-42,
  common/lazy/utils.cpp:33-35), cast with ``self.to(Int)``, which wraps values modulo 2**32 (copy_from.cpp:379-381).
- **Lazy mode checks the range first** (habana_kernels/lazy_kernels.cpp:234-331) while
  ``PT_HPU_ENABLE_VALID_DATA_RANGE_CHECK`` is true, its default: NaN counts as 0, infinities as the extremes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import Tensor

from lightning_gaudi.hpu.runtime import INT64_ENV, bridge_bool

#: The lazy-mode copy's range check (scripts/env_flags.yaml:584-588), on by default.
RANGE_CHECK_ENV = "PT_HPU_ENABLE_VALID_DATA_RANGE_CHECK"
#: c10's names (``toString(ScalarType)``) of the types the bridge's messages print here.
_C10_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.int64: "Long", torch.int32: "Int"}


def int64_supported(lazy: bool, device_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the device keeps int64 tensors in int64 (``common::IsInt64Supported``): ``PT_ENABLE_INT64_SUPPORT``
    where set and not empty, else in eager mode unless the card is first-generation Gaudi, never in lazy mode."""
    raw = (os.environ if environ is None else environ).get(INT64_ENV)
    if raw:  # empty is unset (env_flags.cpp:296-299)
        return bridge_bool(INT64_ENV, raw)
    return not lazy and device_name != "GAUDI"


def range_check_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``PT_HPU_ENABLE_VALID_DATA_RANGE_CHECK`` as the bridge reads it (default true; empty is unset)."""
    raw = (os.environ if environ is None else environ).get(RANGE_CHECK_ENV)
    return bridge_bool(RANGE_CHECK_ENV, raw) if raw else True


def _c10(value: float | int) -> str:
    """A value as ``std::ostream`` prints it: integers in decimal, doubles as ``%g`` does (6 significant digits)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def downcast_range_message(src: torch.dtype, dst: torch.dtype, low: float | int, high: float | int) -> str:
    """The lazy-mode copy's refusal (habana_kernels/lazy_kernels.cpp:283-298) of values from ``low`` to ``high``."""
    info = torch.finfo(dst) if dst.is_floating_point else torch.iinfo(dst)
    lo, hi = (float(info.min), float(info.max)) if dst.is_floating_point else (int(info.min), int(info.max))
    s, d = _C10_NAMES[src], _C10_NAMES[dst]
    return (
        f"Error when trying to cast {s} to {d}, Input values range [{_c10(low)}, {_c10(high)}] exceeds {d} range"
        f" [{_c10(lo)}, {_c10(hi)}]"
    )


def held_values(tensor: Tensor, held: torch.dtype, check_range: bool) -> Tensor:
    """``tensor`` (a host tensor) with the values the device holds once it is copied there in ``held`` (its own dtype
    kept, as on a Gaudi): cast there and back on the CPU as the bridge casts, after the lazy-mode range check
    (``check_range``) that raises its ``RuntimeError``."""
    if held == tensor.dtype:
        return tensor
    if check_range and tensor.numel() > 0:
        info = torch.finfo(held) if held.is_floating_point else torch.iinfo(held)
        values = tensor.detach()
        if values.is_floating_point():  # NaN as 0, infinities as the narrower type's extremes
            values = values.nan_to_num(0.0, float(info.max), float(info.min))
        low, high = values.min().item(), values.max().item()
        if low < info.min or high > info.max:
            raise RuntimeError(downcast_range_message(tensor.dtype, held, low, high))
    return tensor.to(held).to(tensor.dtype)
