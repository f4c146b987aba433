# mypy: disable-error-code="override"
# (torch's stubs type ProcessGroup's collectives with overloads that no Python override can match)
"""The emulator's ``"hccl"`` process group: gloo behind HCCL's rules (:mod:`lightning_gaudi.hpu.hccl`, with their
sources in Intel's bridge), registered as ``torch.distributed``'s ``"hccl"`` backend for CPU tensors."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_gaudi.hpu.hccl import (
    HCCL_DTYPES,
    NATIVE_REDUCE_SCATTER_DTYPES,
    NATIVE_REDUCTION_DTYPES,
    check_dtype,
    check_reduce_op,
)

__all__ = ["EmulatedHCCLGroup", "register_emulated_hccl"]

_options: Any = dist  # the collectives' option classes, which torch's stubs do not declare


def _given(opts: Any) -> tuple[Any, ...]:
    """``opts`` as the argument list of a gloo method, whose own default stands in for none (``AllgatherOptions`` is
    not in ``torch.distributed``'s namespace)."""
    return () if opts is None else (opts,)


def _flat(tensors: Any) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        return [tensors]
    return [t for item in tensors for t in _flat(item)]


def _one_by_one(run: Callable[..., Any], outputs: list[Tensor], inputs: list[Tensor], opts: Any) -> Any:
    """A coalesced collective as one ``run(output, input, opts)`` a pair: the last pair's work, the others waited."""
    works = [run(out, inp, opts) for out, inp in zip(outputs, inputs, strict=True)]
    for work in works[:-1]:
        work.wait()
    return works[-1]


#: dynamo runs these as calls, not traced: the group is an opaque object to it, as a C++ process group is.
_not_traced = torch.compiler.disable


class EmulatedHCCLGroup(dist.ProcessGroup):
    """gloo behind HCCL's rules: the reduce ops, the dtype table and the float32 reductions of Intel's bridge.

    The collectives below check, then run on gloo's own methods (calling the base class's would come back here);
    every other one goes to gloo unchanged, registered as this group's backend for CPU tensors.
    """

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stubs know the store-taking form only
        gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._gloo: Any = gloo  # torch's stubs lack most of its methods
        backend_type = dist.ProcessGroup.BackendType.GLOO
        self._register_backend(torch.device("cpu"), backend_type, gloo)
        self._set_default_backend(backend_type)

    def getBackendName(self) -> str:  # torch's name
        return "hccl"

    def _reduce_in_float32(self, tensors: list[Tensor], opts: Any, run: Callable[[list[Tensor], Any], Any]) -> Any:
        check_dtype(tensors)
        check_reduce_op(opts.reduceOp, tensors[0].dtype if tensors else None)
        if all(t.dtype in NATIVE_REDUCTION_DTYPES for t in tensors):
            return run(tensors, opts)
        carried = [t if t.dtype in NATIVE_REDUCTION_DTYPES else t.float() for t in tensors]
        work = run(carried, opts)
        work.wait()
        for tensor, result in zip(tensors, carried, strict=True):
            if result is not tensor:
                tensor.copy_(result.to(tensor.dtype))
        return work

    @_not_traced
    def allreduce(self, tensors: list[Tensor], opts: Any = None) -> Any:
        opts = _options.AllreduceOptions() if opts is None else opts
        return self._reduce_in_float32(tensors, opts, self._gloo.allreduce)

    @_not_traced
    def allreduce_coalesced(self, tensors: list[Tensor], opts: Any = None) -> Any:
        # the bridge runs allreduce (process_group_hccl_base.cpp:502-506)
        opts = _options.AllreduceCoalescedOptions() if opts is None else opts
        return self._reduce_in_float32(tensors, opts, self._gloo.allreduce_coalesced)

    @_not_traced
    def reduce(self, tensors: list[Tensor], opts: Any = None) -> Any:
        opts = _options.ReduceOptions() if opts is None else opts
        return self._reduce_in_float32(tensors, opts, self._gloo.reduce)

    @_not_traced
    def reduce_scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any = None) -> Any:
        opts = _options.ReduceScatterOptions() if opts is None else opts
        check_dtype(_flat(outputs) + _flat(inputs))
        check_reduce_op(opts.reduceOp, outputs[0].dtype if outputs else None)
        return self._gloo.reduce_scatter(outputs, inputs, opts)

    def _reduce_scatter_single(self, output: Tensor, input: Tensor, opts: Any) -> Any:
        opts = _options.ReduceScatterOptions() if opts is None else opts
        check_dtype([output, input])
        check_reduce_op(opts.reduceOp, output.dtype)
        if output.dtype in NATIVE_REDUCE_SCATTER_DTYPES:
            return self._gloo._reduce_scatter_base(output, input, opts)
        carried = output.float()
        work = self._gloo._reduce_scatter_base(carried, input.float(), opts)
        work.wait()
        output.copy_(carried.to(output.dtype))
        return work

    @_not_traced
    def _reduce_scatter_base(self, output: Tensor, input: Tensor, opts: Any = None) -> Any:
        return self._reduce_scatter_single(output, input, opts)

    @_not_traced
    def reduce_scatter_single(self, output: Tensor, input: Tensor, opts: Any = None) -> Any:  # torch >= 2.12's name
        return self._reduce_scatter_single(output, input, opts)

    @_not_traced
    def reduce_scatter_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> Any:
        return _one_by_one(self._reduce_scatter_single, outputs, inputs, opts)

    @_not_traced
    def reduce_scatter_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> Any:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)  # torch >= 2.12's name

    @_not_traced
    def barrier(self, opts: Any = None) -> Any:
        # through gloo's own method, which lets go of the GIL while it waits: the base class's (torch's trampoline for
        # a Python process group) holds it, and deadlocked with gloo's worker thread freeing an all_gather's tensors
        # (which takes the GIL) under the queue lock the barrier waits for (torchmetrics' sync after all_gather)
        return self._gloo.barrier(_options.BarrierOptions() if opts is None else opts)

    @_not_traced
    def broadcast(self, tensors: list[Tensor], opts: Any = None) -> Any:
        # HCCL broadcasts bytes (getCountDatatype, collective_utils.cpp:122-150): any dtype, where gloo has a table
        opts = _options.BroadcastOptions() if opts is None else opts
        carried = [t.view(torch.uint8) if t.dtype not in HCCL_DTYPES and t.is_contiguous() else t for t in tensors]
        return self._gloo.broadcast(carried, opts)

    @_not_traced
    def allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any = None) -> Any:
        check_dtype(_flat(outputs) + inputs)
        return self._gloo.allgather(outputs, inputs, *_given(opts))

    @_not_traced
    def _allgather_base(self, output: Tensor, input: Tensor, opts: Any = None) -> Any:
        check_dtype([output, input])
        return self._gloo._allgather_base(output, input, *_given(opts))

    @_not_traced
    def all_gather_single(self, output: Tensor, input: Tensor, opts: Any = None) -> Any:  # torch >= 2.12's name
        check_dtype([output, input])
        return self._gloo._allgather_base(output, input, *_given(opts))

    @_not_traced
    def all_gather_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> Any:
        # the bridge's allgather_into_tensor_coalesced (..._base.cpp:1183, its dtype 1269), one gather a pair here
        return _one_by_one(self.all_gather_single, outputs, inputs, opts)

    @_not_traced
    def allgather_into_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> Any:
        return self.all_gather_single_coalesced(outputs, inputs, opts)  # torch < 2.12's name

    # The collectives below only run on gloo's own methods, which let go of the GIL while they wait (see barrier).

    @_not_traced
    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._gloo.gather(outputs, inputs, _options.GatherOptions() if opts is None else opts)

    @_not_traced
    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._gloo.scatter(outputs, inputs, _options.ScatterOptions() if opts is None else opts)

    @_not_traced
    def alltoall(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> Any:
        check_dtype(outputs + inputs)  # ..._base.cpp:581
        return self._gloo.alltoall(outputs, inputs, _options.AllToAllOptions() if opts is None else opts)

    @_not_traced
    def alltoall_base(
        self, output: Tensor, input: Tensor, output_splits: Any, input_splits: Any, opts: Any = None
    ) -> Any:
        check_dtype([output, input])  # ..._base.cpp:677
        opts = _options.AllToAllOptions() if opts is None else opts
        return self._gloo.alltoall_base(output, input, output_splits, input_splits, opts)

    @_not_traced
    def all_to_all_single(
        self, output: Tensor, input: Tensor, output_splits: Any, input_splits: Any, opts: Any = None
    ) -> Any:
        return self.alltoall_base(output, input, output_splits, input_splits, opts)  # torch >= 2.12's name

    @_not_traced
    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        raise RuntimeError("ProcessGroupHcclBase does not support allgather_coalesced")  # ..._base.cpp:1179-1180

    @_not_traced
    def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> Any:
        check_dtype(tensors)
        return self._gloo.send(tensors, dst, tag)

    @_not_traced
    def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> Any:
        check_dtype(tensors)
        return self._gloo.recv(tensors, src, tag)


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> EmulatedHCCLGroup:
    return EmulatedHCCLGroup(store, rank, size, timeout)


def register_emulated_hccl() -> None:
    """Registers :class:`EmulatedHCCLGroup` as ``torch.distributed``'s ``"hccl"`` backend for CPU tensors, unless a
    ``"hccl"`` backend is registered already (torch keeps a registration for the life of the process)."""
    if not hasattr(dist.Backend, "HCCL"):
        dist.Backend.register_backend("hccl", _create, devices=["cpu"])
