"""HCCL's rules for collectives as Intel's bridge (``ProcessGroupHcclBase``) applies them, which gloo does not: the
reduce ops and dtypes it refuses, and the dtypes it reduces in float32. The emulator's ``"hccl"`` group keeps them
(:mod:`lightning_gaudi.emulator.hccl_group`); the plugin adds the way out to the reduce-op error.

Sources (github.com/HabanaAI/gaudi-pytorch-bridge, tag v1.19.0):

- ``backend/helpers/collective_utils.cpp``: the dtype table (lines 26-36), the reduce ops (39-44), the boolean rule
  and the messages (46-65, 95-106);
- ``python_packages/habana_frameworks/torch/distributed/hccl/process_group_hccl_base.cpp``: which collectives look
  their dtype up (``getHCCLDataType``: allreduce 419, reduce 515, alltoall 581, alltoall_base 677, allgather 963,
  _allgather_base 1131, allgather_into_tensor_coalesced 1269, reduce_scatter 1438, _reduce_scatter_base 1483,
  reduce_scatter_tensor_coalesced 1580, send 1685, recv 1746; broadcast, gather and scatter do not), the float32
  round trip of allreduce and reduce (``is_valid_hccl_dtype``, 233-238; 419-425, 487-492, 515-522, 580-585) and of
  _reduce_scatter_base except for int32 and int64 (1482-1492, 1536-1540), and ``allgather_coalesced`` (1175-1181).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

#: The reduce ops HCCL has (``hcclOp``, collective_utils.cpp:39-44); AVG and PREMUL_SUM are refused.
HCCL_REDUCE_OPS = ("SUM", "MIN", "MAX", "PRODUCT")
UNSUPPORTED_REDUCE_OP_MESSAGE = "Unsupported ReduceOp for HCCL process group"  # collective_utils.cpp:64
BOOL_AVG_MESSAGE = "Cannot use ReduceOp.AVG with boolean inputs"  # collective_utils.cpp:57
#: collective_utils.cpp:104, followed by c10's name of the dtype.
UNSUPPORTED_DTYPE_MESSAGE = "Input tensor data type is not supported for HCCL process group: "
#: ``hcclDataType`` (collective_utils.cpp:26-36) and the two float8 types mapped to bytes (95-101).
HCCL_DTYPES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.float64,
        torch.float32,
        torch.float16,
        torch.int32,
        torch.int64,
        torch.bfloat16,
        torch.bool,
        torch.float8_e5m2,
        torch.float8_e4m3fn,
    }
)
#: The dtypes HCCL reduces as they are (``is_valid_hccl_dtype``); allreduce and reduce carry every other one in
#: float32 and cast the result back.
NATIVE_REDUCTION_DTYPES = frozenset({torch.bfloat16, torch.float32})
#: ``_reduce_scatter_base`` also reduces these as they are.
NATIVE_REDUCE_SCATTER_DTYPES = NATIVE_REDUCTION_DTYPES | {torch.int32, torch.int64}

#: c10's names (``toString(ScalarType)``) of the dtypes a user can meet that HCCL refuses.
_C10_NAMES = {
    torch.int16: "Short",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
    torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
    torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
}


def check_reduce_op(op: Any, dtype: torch.dtype | None = None) -> None:
    """Raises HCCL's ``RuntimeError`` for a reduce op it does not have (``getHCCLReduceOp``)."""
    if dtype == torch.bool and op == dist.ReduceOp.AVG:
        raise RuntimeError(BOOL_AVG_MESSAGE)
    if not any(op == getattr(dist.ReduceOp, name) for name in HCCL_REDUCE_OPS):
        raise RuntimeError(UNSUPPORTED_REDUCE_OP_MESSAGE)


def check_dtype(tensors: Iterable[Tensor]) -> None:
    """Raises HCCL's ``RuntimeError`` for a tensor whose dtype is not in its table (``getHCCLDataType``)."""
    for tensor in tensors:
        if tensor.dtype not in HCCL_DTYPES:
            name = _C10_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))
            raise RuntimeError(UNSUPPORTED_DTYPE_MESSAGE + name)


#: What :func:`explain` adds to HCCL's reduce-op error.
REDUCE_OP_WAY_OUT = (
    "lightning_gaudi: HCCL reduces with SUM, MIN, MAX and PRODUCT only (no AVG or PREMUL_SUM). For a mean, all-reduce a"
    ' SUM and divide by the world size, as `self.all_reduce(x, reduce_op="mean")` in a LightningModule and'
    ' `fabric.all_reduce(x, reduce_op="mean")` do.'
)


def explain(error: BaseException) -> bool:
    """Adds the way out to HCCL's reduce-op error (raised by the bridge or the emulator); returns whether it did."""
    if not isinstance(error, RuntimeError) or len(error.args) != 1 or not isinstance(error.args[0], str):
        return False
    message = error.args[0]
    if UNSUPPORTED_REDUCE_OP_MESSAGE not in message or REDUCE_OP_WAY_OUT in message:
        return False
    error.args = (f"{message}\n\n{REDUCE_OP_WAY_OUT}",)
    return True
