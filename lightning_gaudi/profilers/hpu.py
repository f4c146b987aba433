"""``HPUProfiler``: Lightning's PyTorch profiler with HPU activity, a schedule past the warm-up, and a report."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities import rank_zero_warn
from torch.profiler import ProfilerActivity
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.callbacks.memory_stats import check_interval

#: Spans Lightning records around the model's own work in a training step (forward and backward).
_MODEL_SPANS = re.compile(r"\[Strategy\]\w+\.(training_step|backward)$")
#: Spans of work on the host that is not the model, by what a user can change about it.
_HOST_SPANS = {
    "data loading": re.compile(r"train_dataloader_next$|\.batch_to_device$"),
    "callbacks": re.compile(r"\[Callback\]"),
    "optimizer": re.compile(r"^Optimizer\.step#|\.optimizer_zero_grad$"),
}
_STEP_SPAN = re.compile(r"^ProfilerStep#?\d*\*?$")
#: The op every read of a tensor's value goes through (``.item()``, ``bool(tensor)``, ``.tolist()`` of a scalar); a
#: read of a device tensor copies it to the host under it (a copy op, a device kernel), a read of a CPU tensor does not.
_HOST_SYNC_OP = "aten::_local_scalar_dense"


@dataclass
class ProfileReport:
    """The profiled training steps' mean time, its share in the model and outside it by category, the top ``(op, self
    ms)`` and the host syncs."""

    steps: int = 0
    step_ms: float = 0.0
    model_share: float = 0.0
    host_shares: dict[str, float] = field(default_factory=dict)
    top_operators: list[tuple[str, float]] = field(default_factory=list)
    host_syncs: int = 0

    def lines(self) -> list[str]:
        """The report as text a user can act on."""
        if not self.steps:
            return ["HPUProfiler: no training step was profiled (fewer steps than `wait_steps` + 1 + `active_steps`?)."]
        outside = 1.0 - self.model_share
        return [
            f"HPUProfiler: {self.steps} profiled training steps, {self.step_ms:.2f} ms each on average;"
            f" {self.model_share:.0%} in the model (forward + backward), {outside:.0%} outside it.",
            "  outside the model: "
            + ", ".join(f"{name} {share:.0%}" for name, share in self.host_shares.items())
            + f", other (Lightning's loop, logging) {max(outside - sum(self.host_shares.values()), 0.0):.0%}",
            "  top operators by self time: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in self.top_operators),
            f"  host syncs: {self.host_syncs} ({self.host_syncs / self.steps:.2f} per step)"
            + (
                " (reads of a device tensor's value, aten::_local_scalar_dense: each one stalls the host until the"
                " device catches up)"
                if self.host_syncs
                else ""
            ),
        ]


def _intervals(events: Iterable[Any], pattern: re.Pattern[str]) -> list[tuple[float, float]]:
    return [(e.time_range.start, e.time_range.end) for e in events if pattern.search(e.name)]


def _union_length(intervals: list[tuple[float, float]], within: tuple[float, float]) -> float:
    clipped = sorted((max(a, within[0]), min(b, within[1])) for a, b in intervals if b > within[0] and a < within[1])
    total, end = 0.0, within[0]
    for start, stop in clipped:
        start = max(start, end)
        if stop > start:
            total += stop - start
            end = stop
    return total


def build_report(events: Any, top: int = 5) -> ProfileReport:
    """A :class:`ProfileReport` from the profiler's function events (``torch.autograd.profiler_util.EventList``)."""
    events = list(events or [])
    steps = [(e.time_range.start, e.time_range.end) for e in events if _STEP_SPAN.match(e.name)]
    if not steps:
        return ProfileReport()
    step_total = sum(end - start for start, end in steps)
    counted = _intervals(events, _MODEL_SPANS)
    model_total = covered = sum(_union_length(counted, step) for step in steps)
    shares = {}
    for name, pattern in _HOST_SPANS.items():  # each moment counts once: nested spans go to the first category
        counted += _intervals(events, pattern)
        total = sum(_union_length(counted, step) for step in steps)
        shares[name], covered = (total - covered) / step_total, total
    in_steps = [e for e in events if any(s <= e.time_range.start < t for s, t in steps)]
    operators: dict[str, float] = {}
    for event in in_steps:
        if event.name.startswith("aten::"):
            own = event.self_cpu_time_total + getattr(event, "self_device_time_total", 0.0)
            operators[event.name] = operators.get(event.name, 0.0) + own
    ranked = sorted(operators.items(), key=lambda item: -item[1])[:top]
    return ProfileReport(
        steps=len(steps),
        step_ms=step_total / len(steps) / 1000.0,
        model_share=model_total / step_total,
        host_shares=shares,
        top_operators=[(name, us / 1000.0) for name, us in ranked],
        host_syncs=sum(1 for e in in_steps if e.name == _HOST_SYNC_OP and (e.cpu_children or e.kernels)),
    )


class HPUProfiler(PyTorchProfiler):
    """Lightning's PyTorch profiler with HPU activity, a schedule past the warm-up, one trace per rank and a report.

    Args:
        dirpath: where traces and the text summary go (the Trainer's log directory when ``None``).
        filename: the summary's file name (printed when ``None``).
        wait_steps: steps skipped before recording (graph compilation), then ``active_steps`` recorded.
        row_limit: rows of the operator table in the summary.
        **profiler_kwargs: passed to Lightning's ``PyTorchProfiler`` and ``torch.profiler.profile``.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        wait_steps: int = 3,
        active_steps: int = 5,
        row_limit: int = 20,
        **profiler_kwargs: Any,
    ) -> None:
        check_interval("wait_steps", wait_steps, allow_zero=True)
        check_interval("active_steps", active_steps)
        self.wait_steps = wait_steps
        self.active_steps = active_steps
        profiler_kwargs.setdefault(
            "schedule", torch.profiler.schedule(wait=wait_steps, warmup=1, active=active_steps, repeat=1)
        )
        profiler_kwargs.setdefault("sort_by_key", "cpu_time_total")
        self.activities: list[ProfilerActivity] = list(
            profiler_kwargs.setdefault("activities", hpu.get_backend().profiler_activities())
        )
        # the report comes from the training cycle torch hands over (validation and the sanity check run their own)
        self._export_trace = bool(profiler_kwargs.get("export_to_chrome", True))
        profiler_kwargs.setdefault("on_trace_ready", self._on_trace_ready)
        super().__init__(dirpath=dirpath, filename=filename, row_limit=row_limit, **profiler_kwargs)
        self.report = ProfileReport()

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError):  # a constructor that raised left nothing to tear down
            super().__del__()

    def _on_trace_ready(self, profiler: torch.profiler.profile) -> None:
        report = build_report(profiler.events())
        if report.model_share > 0 and self.report.model_share == 0:  # the first cycle with training steps
            self.report = report
        if self._export_trace and self.dirpath is not None:
            worker = f"profile-{self.local_rank}-{self.filename or 'hpu'}"
            torch.profiler.tensorboard_trace_handler(str(self.dirpath), worker_name=worker)(profiler)

    @override
    def summary(self) -> str:
        if self.profiler is not None and getattr(self.profiler, "profiler", True) is None:
            # the schedule never reached its recording steps: torch has no events to give (it would assert)
            self.profiler.__exit__(None, None, None)
            self.profiler = None
        table = super().summary()
        if not self.report.model_share:  # no training cycle was handed over (a schedule without an end, say)
            self.report = build_report(self.function_events)
        if not self.report.steps and self._stage == "fit":
            rank_zero_warn(
                f"HPUProfiler recorded no training step: the run ended before its schedule (`wait_steps="
                f"{self.wait_steps}` skipped, 1 warm-up, then `active_steps={self.active_steps}` recorded) reached a"
                f" recorded step. Lower `wait_steps` or train for more than {self.wait_steps + 1} steps."
            )
        return "\n".join([*self.report.lines(), table]) if table else "\n".join(self.report.lines())
