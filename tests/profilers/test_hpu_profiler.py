"""HPUProfiler: a trace per run with the training step's events, a report naming where step time goes, HPU activity
on the bridge, and a schedule that skips the warm-up."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader
from lightning.pytorch import Trainer
from torch import Tensor
from torch.profiler import ProfilerActivity

from lightning_gaudi import hpu
from lightning_gaudi.profilers import HPUProfiler, build_report


class SyncingWorkload(Workload):
    """Reads its loss on the host every step (a host sync), and does an unmistakable op in the step."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        torch.cumsum(x.repeat(1, 8192), dim=1)  # the heaviest op of the step by far: it must top the report
        loss = ((self.net(x) - y) ** 2).mean()
        self.seen = loss.item()
        return loss


def _fit(profiler: HPUProfiler, steps: int) -> Trainer:
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=steps,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(SyncingWorkload(), loader(steps + 2))
    return trainer


def test_trace_and_report(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    profiler = HPUProfiler(dirpath=tmp_path, filename="profile", wait_steps=2, active_steps=3)
    _fit(profiler, steps=8)
    report = profiler.report
    assert report.steps == 3, "2 steps waited out, 1 warm-up, 3 recorded"
    assert report.host_syncs == 0, "eager emulation has no device: .item() reads host memory"
    assert 0.0 < report.model_share < 1.0
    assert set(report.host_shares) == {"data loading", "callbacks", "optimizer"}
    assert report.step_ms > 0
    assert any(name == "aten::cumsum" or name == "aten::repeat" for name, _ in report.top_operators)
    [trace] = list(tmp_path.glob("*.pt.trace.json"))
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert any("training_step" in str(name) for name in names)
    text = (tmp_path / "fit-profile.txt").read_text()
    assert "host syncs: 0 (0.00 per step)" in text
    assert "top operators by self time" in text


def test_host_syncs_are_reads_of_device_tensors_only(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    """In lazy emulation the loss's ``.item()`` reads the device; Lazy Tensor Core's own reads of CPU scalars (and an
    optimizer's step counters) are reads of host memory, no syncs."""
    profiler = HPUProfiler(dirpath=tmp_path, filename="profile", wait_steps=2, active_steps=3)
    _fit(profiler, steps=8)
    assert profiler.report.steps == 3
    assert profiler.report.host_syncs == 3, "one .item() of the loss per recorded step"


def test_report_when_nothing_was_recorded(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    profiler = HPUProfiler(dirpath=tmp_path, filename="profile", wait_steps=50, active_steps=2)
    with pytest.warns(UserWarning, match=r"recorded no training step.*`wait_steps=50`.*Lower `wait_steps`"):
        _fit(profiler, steps=3)
    assert profiler.report.steps == 0
    assert "no training step was profiled" in profiler.report.lines()[0]


def test_activities_come_from_the_seam(eager_hpu: hpu.Backend) -> None:
    assert HPUProfiler().activities == [ProfilerActivity.CPU]
    assert HPUProfiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]).activities[1] == ProfilerActivity.CUDA


def test_bridge_adds_hpu_activity(bridge_double: ModuleType) -> None:
    assert HPUProfiler().activities == [ProfilerActivity.CPU, ProfilerActivity.HPU]
    assert "import habana_frameworks.torch" in bridge_double.names()


def _event(name: str, start: float, end: float, self_us: float = 0.0, children: tuple[Any, ...] = ()) -> Any:
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        self_cpu_time_total=self_us,
        cpu_children=list(children),
        kernels=[],
    )


def test_report_arithmetic() -> None:
    """One 100 us step: forward 20 us and backward 30 us inside the optimizer step (as Lightning's closure runs
    them), data loading 10 us before it, a callback 5 us inside backward (model time) and one of 10 us inside the
    optimizer step (callback time, not optimizer time)."""
    events = [
        _event("ProfilerStep#4", 0, 100),
        _event("[pl][profile][_TrainingEpochLoop].train_dataloader_next", 0, 10),
        _event("Optimizer.step#SGD.step", 15, 95),
        _event("[pl][profile][Strategy]SingleHPUStrategy.training_step", 20, 40),
        _event("[pl][profile][Strategy]SingleHPUStrategy.backward", 45, 75),
        _event("[pl][profile][Callback]X.on_after_backward", 70, 75),
        _event("[pl][profile][Callback]X.on_before_optimizer_step", 76, 86),  # inside the optimizer step
        _event("aten::mm", 21, 30, self_us=9.0),
        _event("aten::_local_scalar_dense", 80, 81, self_us=1.0, children=(_event("aten::_to_cpu", 80, 81),)),
        _event("aten::_local_scalar_dense", 90, 90),  # a read of a CPU tensor (no copy from the device): no sync
        _event("aten::mm", 200, 210, self_us=50.0),  # outside the profiled step: not counted
    ]
    report = build_report(events)
    assert report.steps == 1
    assert report.step_ms == pytest.approx(0.1)
    assert report.model_share == pytest.approx(0.5)
    assert report.host_shares == pytest.approx({"data loading": 0.1, "callbacks": 0.1, "optimizer": 0.2})
    assert report.top_operators == [("aten::mm", pytest.approx(0.009)), ("aten::_local_scalar_dense", 0.001)]
    assert report.host_syncs == 1


@pytest.mark.parametrize(("kwargs", "match"), [({"wait_steps": -1}, "wait_steps"), ({"active_steps": 0}, "active")])
def test_bad_schedule(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HPUProfiler(**kwargs)
