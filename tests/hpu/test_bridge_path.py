"""The real-bridge code path (``HabanaBackend``), driven through a double of Intel's ``habana_frameworks``."""

from __future__ import annotations

from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from lightning.pytorch import Trainer

from lightning_gaudi import HPUAccelerator, HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu
from lightning_gaudi.distributed import rendezvous
from lightning_gaudi.hpu.backend import MEMORY_BYTE_KEYS
from lightning_gaudi.hpu.bridge import HabanaBackend

GIB = 1024**3


@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_backend_is_the_bridge(bridge_double: ModuleType) -> None:
    backend = hpu.get_backend()
    assert isinstance(backend, HabanaBackend)
    assert not backend.emulated
    assert not hpu.bridge_loaded()  # imported on first use, not when the backend is picked
    assert backend.device_count() == 8
    assert hpu.bridge_loaded()
    assert backend.device_type == "hpu"
    assert backend.autocast_device_type == "hpu"
    assert backend.collective_backend == "hccl"


def test_device_count_and_name_come_from_the_bridge(bridge_double: ModuleType) -> None:
    bridge_double.configure(device_count=3, device_name="GAUDI3")
    assert HPUAccelerator.auto_device_count() == 3
    assert HPUAccelerator.parse_devices("auto") == [0, 1, 2]
    assert hpu.get_backend().device_name() == "GAUDI3"
    assert bridge_double.called("hpu.device_count")
    assert bridge_double.called("hpu.get_device_name")
    with pytest.raises(ValueError, match="asks for 4 HPUs but this node has 3"):
        HPUAccelerator.parse_devices(4)


def test_no_card_means_unavailable(bridge_double: ModuleType) -> None:
    bridge_double.configure(device_count=0)
    assert not HPUAccelerator.is_available()
    assert bridge_double.called("hpu.is_available")


def test_the_hpu_device(bridge_double: ModuleType) -> None:
    hpu_device = torch.device("hpu")
    assert HPUAccelerator.get_parallel_devices(2) == [hpu_device, hpu_device]
    assert HPUAccelerator.get_parallel_devices([1]) == [hpu_device]
    assert SingleHPUStrategy().root_device == hpu_device
    accelerator = HPUAccelerator()
    accelerator.setup_device(hpu_device)
    with pytest.raises(ValueError, match="expected a 'hpu' device"):
        accelerator.setup_device(torch.device("cpu"))

    trainer = Trainer(accelerator="hpu", devices=1, precision="bf16-mixed", logger=False)
    assert isinstance(trainer.strategy, SingleHPUStrategy)
    assert trainer.strategy.root_device == hpu_device
    assert isinstance(trainer.precision_plugin, HPUPrecision)
    assert trainer.precision_plugin.device == "hpu"  # autocast on the HPU, not CUDA

    trainer = Trainer(accelerator="hpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    assert trainer.strategy.parallel_devices == [hpu_device, hpu_device]
    assert trainer.strategy._get_process_group_backend() == "hccl"


def test_memory_stats_keys_and_device_stats(bridge_double: ModuleType) -> None:
    bridge_double.configure(memory={"Limit": 96 * GIB, "InUse": 3 * GIB, "MaxInUse": 5 * GIB, "NumAllocs": 7})
    stats = hpu.get_backend().memory_stats()
    assert tuple(stats) == hpu.MEMORY_STAT_KEYS
    assert stats["InUse"] == 3 * GIB
    device_stats = HPUAccelerator().get_device_stats(torch.device("hpu"))
    assert device_stats["hpu/InUse (GiB)"] == 3.0
    assert device_stats["hpu/MaxInUse (GiB)"] == 5.0
    assert device_stats["hpu/Limit (GiB)"] == 96.0
    assert device_stats["hpu/NumAllocs"] == 7
    assert len(device_stats) == len(hpu.MEMORY_STAT_KEYS)
    assert bridge_double.called("hpu.memory_stats")
    hpu.get_backend().reset_peak_memory_stats()
    assert bridge_double.called("hpu.reset_peak_memory_stats")


def test_device_stats_keep_counters_as_counts(bridge_double: ModuleType) -> None:
    """Byte values in GiB; allocation counters as plain counts, without a unit they do not have."""
    bridge_double.configure(
        memory={
            "Limit": 96 * GIB,
            "InUse": GIB // 2,
            "MaxInUse": 3 * GIB // 4,
            "MaxAllocSize": GIB // 4,
            "NumAllocs": 12345,
            "NumFrees": 12000,
            "ActiveAllocs": 345,
            "TotalSystemAllocs": 17,
            "TotalSystemFrees": 3,
            "TotalActiveAllocs": 14,
        }
    )
    stats = HPUAccelerator().get_device_stats(torch.device("hpu"))
    assert stats == {
        "hpu/Limit (GiB)": 96.0,
        "hpu/InUse (GiB)": 0.5,
        "hpu/MaxInUse (GiB)": 0.75,
        "hpu/MaxAllocSize (GiB)": 0.25,
        "hpu/NumAllocs": 12345,
        "hpu/NumFrees": 12000,
        "hpu/ActiveAllocs": 345,
        "hpu/TotalSystemAllocs": 17,
        "hpu/TotalSystemFrees": 3,
        "hpu/TotalActiveAllocs": 14,
    }
    assert all(type(stats[f"hpu/{key}"]) is int for key in hpu.MEMORY_STAT_KEYS if key not in MEMORY_BYTE_KEYS)


def test_device_stats_name_a_key_the_bridge_adds_without_a_unit(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import habana_frameworks.torch.hpu as bridge_hpu

    reported = {**bridge_double.memory(), "InUse": GIB, "PeakFragmentation": 3}
    monkeypatch.setattr(bridge_hpu, "memory_stats", lambda device=None: reported)
    stats = HPUAccelerator().get_device_stats(torch.device("hpu"))
    assert stats["hpu/InUse (GiB)"] == 1.0
    assert stats["hpu/PeakFragmentation"] == 3, "a key of unknown unit is passed on as it is, without a unit"


def test_get_device_name_is_the_bridge_name(bridge_double: ModuleType) -> None:
    bridge_double.configure(device_name="GAUDI3")
    assert HPUAccelerator.get_device_name() == "GAUDI3"
    assert bridge_double.called("hpu.get_device_name")


def test_out_of_memory_is_recognised(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The double runs out of memory when a graph launches, in the bridge's words (gaudi-pytorch-bridge v1.19.0,
    backend/synapse_helpers/device_memory.cpp:1060-1065); the seam says it is an HPU OOM, Lightning cannot."""
    from lightning.pytorch.utilities.memory import is_oom_error

    bridge_double.configure(lazy=True, memory={"Limit": 8 * GIB, "InUse": 6 * GIB})
    backend = hpu.get_backend()
    bridge_double.run_ops(GIB)
    backend.mark_step()  # fits
    bridge_double.run_ops(3 * GIB)  # in lazy mode the graph runs, and fails, at the cut
    with pytest.raises(RuntimeError) as error:
        backend.mark_step()
    assert type(error.value) is RuntimeError  # c10::Error, not torch.OutOfMemoryError
    assert (
        str(error.value) == "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::3221225472 (3072)MB"
    )
    bridge_double.configure(lazy=False)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(RuntimeError) as eager_error:
        bridge_double.run_ops(3 * GIB + 2**19)  # in eager mode, at once
    message = "[Rank:3] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::3221749760 (3072.5)MB"
    assert str(eager_error.value) == message
    assert backend.is_out_of_memory(error.value)
    assert backend.is_out_of_memory(eager_error.value)
    assert not is_oom_error(error.value), "Lightning recognises it now: the tuner patch may be unnecessary"
    assert backend.is_out_of_memory(torch.OutOfMemoryError("HPU ran out"))
    assert not backend.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not backend.is_out_of_memory(ValueError(f"not an {bridge_double.OUT_OF_MEMORY} error: wrong type"))


def test_mode_and_mark_step(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = hpu.get_backend()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert not backend.is_lazy()
    assert backend.lazy_counters() is None
    bridge_double.configure(lazy=True)
    assert backend.is_lazy()
    backend.mark_step()
    backend.synchronize()
    assert [call.name for call in bridge_double.calls][-2:] == ["core.mark_step", "hpu.synchronize"]


def test_lazy_counters_read_bridge_metrics(bridge_double: ModuleType) -> None:
    bridge_double.configure(
        lazy=True,
        metrics={
            "graph_compilation": [("TotalNumber", 5), ("TotalTime", 1000), ("AvgTime", 200)],
            "cpu_fallback": [("TotalNumber", 2), ("FallbackOps", {"digamma": 2})],
        },
    )
    backend = hpu.get_backend()
    counters = backend.lazy_counters()
    assert counters is not None
    assert counters.graph_compilations == 5
    assert counters.cpu_fallbacks == {"digamma": 2}
    assert counters.host_syncs is None  # the bridge does not count them
    backend.reset_lazy_counters()
    assert {call.args[0] for call in bridge_double.called("metrics.reset")} == {"graph_compilation", "cpu_fallback"}
    counters = backend.lazy_counters()
    assert counters is not None
    assert counters.graph_compilations == 0


def test_fused_ops_go_to_hpex(bridge_double: ModuleType) -> None:
    backend = hpu.get_backend()
    layer = torch.nn.Linear(4, 2)
    adamw = backend.fused_adamw(layer.parameters(), lr=0.01, weight_decay=0.1)
    assert type(adamw).__name__ == "FusedAdamW"
    assert bridge_double.called("hpex.FusedAdamW")[0].kwargs["lr"] == 0.01
    sgd = backend.fused_sgd(layer.parameters(), lr=0.1, momentum=0.9)
    assert type(sgd).__name__ == "FusedSGD"
    assert bridge_double.called("hpex.FusedSGD")[0].kwargs["momentum"] == 0.9

    layer(torch.randn(3, 4)).sum().mul(100).backward()
    clipper = backend.fused_clip_norm(layer.parameters(), max_norm=1.0)
    norm = clipper.clip_norm(layer.parameters())
    assert norm > 1.0
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in layer.parameters()]))
    torch.testing.assert_close(clipped, torch.tensor(1.0), rtol=1e-4, atol=1e-4)
    assert bridge_double.called("hpex.FusedClipNorm")[0].kwargs["max_norm"] == 1.0
    assert bridge_double.called("hpex.FusedClipNorm.clip_norm")

    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    out = backend.sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert bridge_double.called("hpex.FusedSDPA.apply")[0].kwargs["is_causal"] is True

    assert backend.wrap_in_hpu_graph(layer) is layer
    assert bridge_double.called("hpu.wrap_in_hpu_graph")[0].args == (layer,)


def test_fp16_depends_on_the_generation(bridge_double: ModuleType) -> None:
    assert hpu.get_backend().supports_fp16()  # GAUDI2
    hpu._backends.clear()
    bridge_double.configure(device_name="GAUDI")
    with pytest.raises(ValueError, match="first-generation Gaudi"):
        HPUPrecision("16-mixed")


def _parallel_strategy(devices: int, num_nodes: int) -> HPUParallelStrategy:
    strategy = HPUParallelStrategy(
        accelerator=HPUAccelerator(),
        parallel_devices=HPUAccelerator.get_parallel_devices(devices),
        cluster_environment=LightningEnvironment(),
        timeout=timedelta(seconds=30),
    )
    strategy._num_nodes = num_nodes
    return strategy


def test_setup_distributed_initialises_hccl(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """World size, global rank and local rank reach ``initialize_distributed_hpu`` before the process group."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29513")
    groups: list[dict[str, Any]] = []

    def init_process_group(backend: str, **kwargs: Any) -> None:
        bridge_double.record("dist.init_process_group", backend, **kwargs)
        groups.append({"backend": backend, **kwargs})

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    # no rank 0 runs here: the check that a store answers on MASTER_PORT would wait out the timeout
    monkeypatch.setattr(rendezvous, "probe_store", lambda *args, **kwargs: None)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: groups[-1]["world_size"])
    strategy = _parallel_strategy(devices=2, num_nodes=2)
    strategy.setup_distributed()

    init = bridge_double.called("hccl.initialize_distributed_hpu")
    assert len(init) == 1
    assert init[0].kwargs == {"world_size": 4, "rank": 3, "local_rank": 1}
    names = bridge_double.names()
    assert names.index("import hccl") < names.index("hccl.initialize_distributed_hpu")
    assert names.index("hccl.initialize_distributed_hpu") < names.index("dist.init_process_group")
    assert groups == [{"backend": "hccl", "rank": 3, "world_size": 4, "timeout": timedelta(seconds=30)}]
    assert strategy.root_device == torch.device("hpu")


def test_hccl_process_group_really_starts(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process group on the double's ``hccl`` backend (gloo underneath) comes up and reduces."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_network_port()))
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    strategy = _parallel_strategy(devices=1, num_nodes=1)
    try:
        strategy.setup_distributed()
        assert dist.get_backend() == "hccl"
        assert bridge_double.called("hccl.initialize_distributed_hpu")[0].kwargs == {
            "world_size": 1,
            "rank": 0,
            "local_rank": 0,
        }
        reduced = strategy.reduce(torch.tensor([2, 4]), reduce_op="mean")
        assert reduced.dtype == torch.float32  # HCCL reduces long tensors as float
        torch.testing.assert_close(reduced, torch.tensor([2.0, 4.0]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
