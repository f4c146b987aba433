"""A check that every rank hands a collective the same tensor layout, before gloo aborts or returns garbage."""

from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

_DIMS = 8  # dimensions described one by one; more are compared through the element count
_MAX = 2**31 - 1  # int32 (every backend gathers it), clamped: no real tensor has that many elements along a dim


class CollectiveMismatchError(ValueError):
    """The ranks passed tensors of different shapes or dtypes to the same collective: a bug in the calling code."""


def _dtype_code(dtype: torch.dtype) -> int:
    # the same on every rank (unlike hash(), which is salted per process)
    return zlib.crc32(str(dtype).encode()) & _MAX


def _describe(row: list[int], dtypes: dict[int, torch.dtype]) -> str:
    ndim, numel, code, *dims = row
    shape = tuple(dims[: min(ndim, _DIMS)])
    text = f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}{', ...' if ndim > _DIMS else ''})"
    dtype = dtypes.get(code)
    return f"shape {text} ({numel} elements) {str(dtype).removeprefix('torch.') if dtype else f'dtype #{code}'}"


def check_same_layout(tensor: Tensor, what: str, group: Any | None = None) -> None:
    """Raises :class:`CollectiveMismatchError` on every rank unless all ranks of ``group`` pass one shape and dtype
    (one all_gather of 11 integers and a host sync)."""
    if not dist.is_available() or not dist.is_initialized():
        return
    world = dist.get_world_size(group)
    if world < 2:
        return
    dims = list(tensor.shape[:_DIMS]) + [-1] * (_DIMS - min(tensor.dim(), _DIMS))
    row = [tensor.dim(), tensor.numel(), _dtype_code(tensor.dtype), *dims]
    mine = torch.tensor([min(value, _MAX) for value in row], dtype=torch.int32, device=tensor.device)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    described = [row.tolist() for row in rows]
    if all(row == described[0] for row in described):
        return
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    dtypes = {_dtype_code(tensor.dtype): tensor.dtype}
    dtypes.update({_dtype_code(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)})
    layouts = "; ".join(f"rank {rank}: {_describe(row, dtypes)}" for rank, row in zip(ranks, described, strict=True))
    raise CollectiveMismatchError(
        f"{what} needs a tensor of the same shape and dtype on every rank, but the ranks passed different ones:"
        f" {layouts}. Pad or trim to one shape first (a smaller last batch on some ranks is the usual cause: use"
        " drop_last=True or pad the batch), cast to one dtype, or send Python objects with"
        " torch.distributed.all_gather_object."
    )
