"""The emulated process group keeps HCCL's rules (lightning_gaudi/hpu/hccl.py, sources cited there): what gloo accepts
and a Gaudi refuses fails here too, with the bridge's words."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from lightning_gaudi.emulator import hccl_group


@pytest.fixture
def group() -> Iterator[dist.ProcessGroup]:
    hccl_group.register_emulated_hccl()
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_group_is_hccl_over_gloo(group: dist.ProcessGroup) -> None:
    assert dist.get_backend() == "hccl"
    assert isinstance(group, hccl_group.EmulatedHCCLGroup)
    assert isinstance(group._get_backend(torch.device("cpu")), dist.ProcessGroupGloo)


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT])
def test_hccl_reduce_ops_reduce(group: dist.ProcessGroup, op: dist.ReduceOp) -> None:
    tensor = torch.tensor([3.0, -2.0])
    dist.all_reduce(tensor, op=op)
    assert tensor.tolist() == [3.0, -2.0]


@pytest.mark.parametrize(
    "collective",
    [
        lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.AVG),
        lambda: dist.reduce(torch.ones(2), dst=0, op=dist.ReduceOp.AVG),
        lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2), op=dist.ReduceOp.AVG),
        lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2)], op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(0.5)),
        lambda: funcol.all_reduce(torch.ones(2), "avg", dist.group.WORLD),
    ],
    ids=["all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter", "premul_sum", "functional"],
)
def test_other_reduce_ops_fail_as_on_hccl(group: dist.ProcessGroup, collective) -> None:
    with pytest.raises(RuntimeError, match=r"^Unsupported ReduceOp for HCCL process group$"):
        collective()


def test_avg_of_booleans_is_its_own_error(group: dist.ProcessGroup) -> None:
    with pytest.raises(RuntimeError, match=r"^Cannot use ReduceOp\.AVG with boolean inputs$"):
        dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG)


@pytest.mark.parametrize(("dtype", "name"), [(torch.int16, "Short"), (torch.uint16, "UInt16")])
def test_dtypes_outside_hccls_table_fail(group: dist.ProcessGroup, dtype: torch.dtype, name: str) -> None:
    message = f"^Input tensor data type is not supported for HCCL process group: {name}$"
    with pytest.raises(RuntimeError, match=message):
        dist.all_reduce(torch.ones(2, dtype=dtype))
    with pytest.raises(RuntimeError, match=message):
        dist.all_gather_into_tensor(torch.empty(2, dtype=dtype), torch.ones(2, dtype=dtype))
    dist.broadcast(torch.ones(2, dtype=dtype), src=0)  # broadcast moves bytes: any dtype


def test_allreduce_carries_other_dtypes_in_float32(group: dist.ProcessGroup) -> None:
    # HCCL reduces bf16 and fp32 as they are and everything else in float32: an int64 past 2**24 is rounded
    count = torch.tensor([2**24 + 1], dtype=torch.int64)
    dist.all_reduce(count)
    assert count.dtype == torch.int64
    assert count.item() == 2**24
    precise = torch.tensor([1.0 + 2**-40], dtype=torch.float64)
    dist.all_reduce(precise)
    assert precise.item() == 1.0


def test_reduce_scatter_keeps_integers_exact(group: dist.ProcessGroup) -> None:
    out = torch.empty(1, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.tensor([2**24 + 1]))
    assert out.item() == 2**24 + 1
    half = torch.empty(1, dtype=torch.float64)
    dist.reduce_scatter_tensor(half, torch.tensor([1.0 + 2**-40], dtype=torch.float64))
    assert half.item() == 1.0


def test_allgather_coalesced_is_refused(group: dist.ProcessGroup) -> None:
    with pytest.raises(RuntimeError, match="does not support allgather_coalesced"):
        group.allgather_coalesced([[torch.empty(1)]], [torch.ones(1)])


def test_the_reduce_op_error_names_the_way_out(group: dist.ProcessGroup) -> None:
    from lightning_gaudi import hpu

    with pytest.raises(RuntimeError) as caught:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.AVG)
    assert hpu.explain_error(caught.value)
    assert not hpu.explain_error(caught.value)  # once
    message = str(caught.value)
    assert message.startswith("Unsupported ReduceOp for HCCL process group\n\nlightning_gaudi: HCCL reduces with SUM")
    assert "divide by the world size" in message


def test_barrier_goes_to_gloo_letting_go_of_the_gil(group: dist.ProcessGroup) -> None:
    """torch's trampoline runs a collective the group does not define holding the GIL, which deadlocked a barrier with
    gloo's worker thread freeing an async all_gather's tensors (a Fabric job's torchmetrics sync, about 1 run in 3)."""
    assert "barrier" in hccl_group.EmulatedHCCLGroup.__dict__
    for _ in range(20):
        gathered = [torch.zeros(3)]
        dist.all_gather(gathered, torch.ones(3), async_op=True)
        dist.barrier()


def test_the_other_collectives_run_on_gloo(group: dist.ProcessGroup) -> None:
    gathered = [torch.empty(2)]
    dist.gather(torch.ones(2), gathered, dst=0)
    assert gathered[0].tolist() == [1.0, 1.0]
    out = torch.empty(2)
    dist.scatter(out, [torch.full((2,), 3.0)], src=0)
    assert out.tolist() == [3.0, 3.0]
    single = torch.empty(2)
    dist.all_to_all_single(single, torch.arange(2.0))
    assert single.tolist() == [0.0, 1.0]
    dist.barrier()
    with pytest.raises(ValueError, match="only implemented for GLOO"):  # torch's rule, on a Gaudi too
        dist.monitored_barrier()
    with pytest.raises(RuntimeError, match="not supported for HCCL process group: Short"):
        dist.all_to_all_single(torch.empty(2, dtype=torch.int16), torch.ones(2, dtype=torch.int16))


def test_dynamo_never_traces_into_the_group() -> None:
    """A compiled module's collectives (DDP's buffer broadcast) are calls to it: dynamo cannot read its Python state."""
    helpers = {"__init__", "getBackendName", "_reduce_in_float32", "_reduce_scatter_single"}
    collectives = {name for name, value in vars(hccl_group.EmulatedHCCLGroup).items() if callable(value)} - helpers
    assert {"broadcast", "allreduce", "barrier", "_reduce_scatter_base"} <= collectives
    traced = {
        name for name in collectives if not getattr(vars(hccl_group.EmulatedHCCLGroup)[name], "_torchdynamo_disable", 0)
    }
    assert traced == set()
