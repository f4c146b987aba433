"""Graph diagnostics for lazy and compile mode: what compiled when, and why; host syncs and CPU fallbacks."""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sysconfig
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader, rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from typing_extensions import override

import lightning_gaudi
from lightning_gaudi import hpu
from lightning_gaudi.callbacks import dynamo
from lightning_gaudi.callbacks.inference import HPUCompile
from lightning_gaudi.callbacks.memory_stats import check_interval
from lightning_gaudi.data import BucketedPadCollate
from lightning_gaudi.hpu import runtime

#: The keys of :attr:`GraphDiagnostics.summary` that are logged, as ``graph_diagnostics/<key>``.
LOGGED_KEYS = (
    "optimizer_steps",
    "graph_compilations",
    "graph_compilations_after_warmup",
    "validation_graph_compilations",
    "distinct_input_shapes",
    "host_syncs_per_step",
    "recompile_limit_hit",
)
PADDING_ADVICE = (
    "Pad batches to a few lengths (lightning_gaudi.data.BucketedPadCollate: one graph per bucket) or to one fixed"
    " length, and drop the ragged last batch (`DataLoader(..., drop_last=True)`)"
)

_NUMBERS = re.compile(r"\d+")
TOP_SYNC_SOURCES = 5  # host-sync sources the end-of-fit text names
_SYNCS = ("host_syncs", "host_syncs_per_step", "host_syncs_by_phase", "host_sync_sources", "host_sync_source_details")

Shapes = tuple[tuple[int, ...], ...]


def batch_shapes(batch: Any) -> Shapes:
    """The shapes of the tensors in ``batch`` (host metadata only)."""
    if isinstance(batch, Tensor):
        return (tuple(batch.shape),)
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return tuple(shape for item in batch for shape in batch_shapes(item))
    return ()


def _package_dir(module: Any) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


_TORCH_DIR = _package_dir(torch)
_LIBRARY_DIRS = (_package_dir(lightning), _package_dir(lightning_gaudi))
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")})
#: (path fragment or function name, phase): Lightning's code that says what a sync belongs to.
_PHASE_MARKERS = (
    (os.sep + "progress" + os.sep, "progress bar"),
    (os.sep + "logger_connector" + os.sep, "logging"),
    (os.sep + "loggers" + os.sep, "logging"),
    ("checkpoint", "checkpoint"),
    ("scheduler", "scheduler"),
    ("_update_learning_rates", "scheduler"),
    ("optimizer_step", "optimizer step"),
    ("training_step", "training step"),
    ("validation_step", "validation step"),
    ("_call_callback_hooks", "callback"),
    ("setup_data", "data loader setup"),
)
_TRAINER_FILE = os.path.join("pytorch", "trainer", "trainer.py")
_TRAINER_ENTRIES = frozenset({"fit", "validate", "test", "predict"})


@dataclass(frozen=True)
class SyncSource:
    """Where a host sync came from, the trainer's phase, and whether the line is the user's (not a library's)."""

    location: str
    code: str
    phase: str
    user: bool


def _show_path(filename: str) -> str:
    for root in (*_LIBRARY_DIRS, _TORCH_DIR):
        if filename.startswith(root):
            return os.path.relpath(filename, os.path.dirname(root.rstrip(os.sep)))
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def find_sync_source(frame: FrameType | None, default_phase: str) -> SyncSource | None:
    """The user's line a host sync came from, walking out from ``frame`` past torch and the standard library (past
    ``Trainer.fit``: the library's innermost frame); the phase of the innermost Lightning frame that says one."""
    library: FrameType | None = None
    user: FrameType | None = None
    phase: str | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_LIBRARY_DIRS):
            if phase is None:
                name = frame.f_code.co_name
                phase = next((p for marker, p in _PHASE_MARKERS if marker in filename or marker in name), None)
            if filename.endswith(_TRAINER_FILE) and frame.f_code.co_name in _TRAINER_ENTRIES:
                break
            library = library or frame
        elif user is None and not filename.startswith((_TORCH_DIR, *_STDLIB_DIRS)) and not filename.startswith("<"):
            user = frame
        frame = frame.f_back
    found = user if user is not None else library
    if found is None:
        return None
    filename, line = found.f_code.co_filename, found.f_lineno
    code = linecache.getline(filename, line).strip()
    return SyncSource(f"{_show_path(filename)}:{line}", code, phase or default_phase, found is user)


class SyncSourceMode(TorchFunctionMode):
    """While entered, attributes each host sync (counted by ``read_syncs()`` around every torch function: opt-in
    diagnostics only) to its source line (:func:`find_sync_source`)."""

    def __init__(self, read_syncs: Callable[[], int], phase: Callable[[], str]) -> None:
        super().__init__()
        self._read = read_syncs
        self._phase = phase
        self.sources: Counter[SyncSource] = Counter()

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        before = self._read()
        result = func(*args, **(kwargs or {}))
        synced = self._read() - before
        if synced > 0:
            frame = inspect.currentframe()
            source = find_sync_source(frame.f_back if frame is not None else None, self._phase())
            del frame
            if source is not None:
                self.sources[source] += synced
        return result


@dataclass
class _Batch:
    """What one training batch compiled, up to the next batch's start."""

    index: int
    step: int
    shapes: Shapes
    new_shapes: bool
    after_validation: bool
    epoch_start: bool
    reads_logged: str | None  # who reads the values logged with ``self.log`` at the end of this batch
    compilations: int = 0
    compiled: list[dynamo.Compilation] = field(default_factory=list)
    fallbacks: Counter[str] = field(default_factory=Counter)


class _LazyTracker:
    """Lazy mode: the bridge's counters between flushes; host syncs by phase and their sources, CPU fallbacks."""

    def __init__(self, backend: hpu.Backend, phase: Callable[[], str]) -> None:
        self.backend = backend
        self._last = backend.lazy_counters()
        self.syncs: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.sources: SyncSourceMode | None = None
        if self._last is not None and self._last.host_syncs is not None:
            self.sources = SyncSourceMode(self._read_syncs, lambda: {"training": "training step"}.get(phase(), phase()))

    def _read_syncs(self) -> int:
        counters = self.backend.lazy_counters()
        return 0 if counters is None else counters.host_syncs or 0

    def flush(self, phase: str) -> tuple[int, Counter[str]]:
        """The graphs compiled and the CPU fallbacks since the last flush; the host syncs since are ``phase``'s."""
        now = self.backend.lazy_counters()
        before, self._last = self._last, now
        if now is None or before is None:
            return 0, Counter()
        fallbacks = Counter(now.cpu_fallbacks) - Counter(before.cpu_fallbacks)
        self.fallbacks.update(fallbacks)
        if now.host_syncs is not None and before.host_syncs is not None:
            self.syncs[phase] += now.host_syncs - before.host_syncs
        return now.graph_compilations - before.graph_compilations, fallbacks

    def summary(self, steps: int) -> dict[str, Any]:
        if self.sources is None:  # host syncs are not counted
            return {}
        by_phase = {phase: self.syncs[phase] for phase in ("training", "validation", "other")}
        syncs = sum(by_phase.values())
        found = self.sources.sources.most_common()
        by_location = sum((Counter({where.location: count}) for where, count in found), Counter[str]())
        return {
            "host_syncs": syncs,
            "host_syncs_per_step": syncs / max(steps, 1),
            "host_syncs_by_phase": by_phase,
            "host_sync_sources": dict(by_location.most_common()),
            "host_sync_source_details": [
                {"source": src.location, "code": src.code, "phase": src.phase, "user": src.user, "count": n}
                for src, n in found
            ],
        }


class _DynamoTracker:
    """Compile mode: what dynamo compiled between flushes, its graph breaks (each kind warned about once)."""

    def __init__(self, once: Callable[[str], bool]) -> None:
        self._once = once
        self._frames, self._graphs = dynamo.frames_started(), dynamo.graphs_compiled()
        self._log = dynamo.CompilationLog()
        self.recorder = dynamo.GraphBreakRecorder()
        self.frames_compiled = self.recompiles = 0
        self.limit_hit = False
        self.breaks: Counter[str] = Counter()

    def flush(self) -> tuple[int, list[dynamo.Compilation]]:
        """The graphs and the frames compiled since the last flush."""
        frames = dynamo.frames_started()
        if frames == self._frames:
            return 0, []
        self._frames = frames
        found = self._log.read()
        graphs, self._graphs = dynamo.graphs_compiled() - self._graphs, dynamo.graphs_compiled()
        self.frames_compiled += len(found)
        self.recompiles += sum(1 for compilation in found if compilation.recompile_reason)
        self.limit_hit |= any(compilation.recompile_limit_hit for compilation in found)
        return graphs, found

    def flush_breaks(self) -> None:
        breaks, self.recorder.breaks[:] = list(self.recorder.breaks), []
        for found in breaks:
            key = f"{found.reason} ({found.location})"
            self.breaks[key] += 1
            if self._once(f"break:{key}"):
                rank_zero_warn(
                    f"torch.compile split a graph at {found.location}: {found.reason}. The pieces run as separate"
                    " graphs with Python between them; move what breaks out of the compiled module, or pass"
                    " HPUCompile(fullgraph=True) to make graph breaks errors."
                )


class GraphDiagnostics(Callback):
    """Reports every graph compilation after warm-up with its cause, in lazy mode and in compile mode; host syncs and
    CPU fallbacks. The end-of-fit summary is printed, logged (``graph_diagnostics/<key>``) and kept in :attr:`summary`
    (``None`` where this mode does not count a key); docs/callbacks.md lists the causes and the keys.

    Args:
        warmup_steps: optimizer steps allowed to compile graphs.

    Raises:
        ValueError: a negative ``warmup_steps``.
    """

    def __init__(self, warmup_steps: int = 3) -> None:
        check_interval("warmup_steps", warmup_steps, allow_zero=True)
        self.warmup_steps = warmup_steps
        self._mode: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.summary: dict[str, Any] = {}
        self._lazy: _LazyTracker | None = None
        self._dynamo: _DynamoTracker | None = None
        self._first_step = self._validation_runs = self._before_validation = 0
        self._phase = self._resume_phase = "other"
        self._batch: _Batch | None = None
        self._validated = False
        self._compilations: Counter[str] = Counter()  # by phase: training (warm-up / after), validation, other
        self._shapes, self._by_shape = Counter[Shapes](), Counter[Shapes]()  # every batch's, compiling batches'
        self._reasons: list[str] = []
        self._warned: set[str] = set()
        self._compile: HPUCompile | None = None
        self._module: nn.Module | None = None
        self._buckets: list[int] | None = None  # BucketedPadCollate's, when the training loader pads with it
        self._exits = ExitStack()  # the sync tracer and dynamo's logger, given back at the end of the fit

    def _flush(self, trainer: pl.Trainer) -> bool:
        """Counts what was compiled since the last flush; ``False`` outside a fit this callback follows."""
        if self._lazy is not None:
            compiled, fallbacks = self._lazy.flush(self._phase)
            self._count(compiled)
            if self._phase == "training" and self._batch is not None:
                self._batch.fallbacks.update(fallbacks)
        elif self._dynamo is not None:
            graphs, found = self._dynamo.flush()
            self._count(graphs)
            for compilation in found:
                if compilation.recompile_reason and compilation.recompile_reason not in self._reasons:
                    self._reasons.append(compilation.recompile_reason)
                if compilation.recompile_limit_hit:
                    self._warn_limit(compilation, trainer)
            if self._phase == "training" and self._batch is not None:
                self._batch.compiled += found
            self._dynamo.flush_breaks()
        return self._mode is not None

    def _count(self, compiled: int) -> None:
        if not compiled:
            return
        if self._phase == "training" and self._batch is not None:
            self._batch.compilations += compiled
            self._by_shape[self._batch.shapes] += compiled
            self._compilations["after_warmup" if self._warm(self._batch) else "warmup"] += compiled
        else:
            self._compilations[self._phase] += compiled

    def _warm(self, batch: _Batch) -> bool:
        return batch.step - self._first_step >= self.warmup_steps

    def _once(self, key: str) -> bool:
        new = key not in self._warned
        self._warned.add(key)
        return new

    def _close_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None and self._module is not None and self._mode != "lazy":
            module, self._module = self._module, None
            _warn_module_compile_of_torch_modules(module)
        if batch is None or not self._warm(batch):
            return
        if self._mode == "lazy":
            self._explain_lazy(batch)
        else:
            self._explain_compile(batch)
        if batch.fallbacks and self._fallbacks_are_real() and self._once("fallback"):
            rank_zero_warn(
                f"Training batch {batch.index} ran {', '.join(sorted(batch.fallbacks))} on the CPU (an op the device"
                " lacks): every step pays a device-to-host round trip." + self._bridge_hint()
            )

    def _head(self, batch: _Batch, what: str) -> str:
        return (
            f"Training batch {batch.index} (optimizer step {batch.step}) {what} after the {self.warmup_steps} warm-up"
            " optimizer steps; each compilation stalls training."
        )

    def _explain_lazy(self, batch: _Batch) -> None:
        if not batch.compilations:
            return
        if batch.new_shapes:
            kind, cause = "shapes", f"new input shapes {list(batch.shapes)}"
            message = f"Cause: this batch has {cause}; each new shape compiles new graphs. {self._padding_advice()}."
        elif batch.after_validation:
            kind, cause = "after_validation", "the first training step after validation"
            message = (
                f"Cause: it is {cause} (eval mode, no gradients ran other graphs): once. If it repeats after every"
                " validation, something the step reads changed during validation."
            )
        elif batch.epoch_start:
            kind, cause = "epoch_start", "the first training step of an epoch"
            message = f"Cause: it is {cause}: Lightning's end-of-epoch bookkeeping of `self.log` values, compiled once."
        elif batch.reads_logged is not None:
            kind, cause = "logging", f"the first step on which {batch.reads_logged} reads the logged values"
            message = f"Cause: it is {cause} (`self.log`): reading them is a graph of its own, compiled once."
        else:
            kind, cause = "unexplained", "no new shapes: a Python number baked into the graph, or data-dependent shapes"
            message = (
                "Likely causes: a Python number that changes every step (a step counter, a schedule value) used in a"
                " tensor op (pass it as a tensor instead), or data-dependent shapes (boolean masks, `nonzero`)."
            )
        if cause not in self._reasons:
            self._reasons.append(cause)
        if self._once(f"lazy:{kind}"):
            what = f"compiled {batch.compilations} new graph(s)"
            rank_zero_warn(f"{self._head(batch, what)} {message}{self._bridge_hint()}")

    def _padding_advice(self) -> str:
        if self._buckets is None:
            return PADDING_ADVICE
        return (
            f"BucketedPadCollate already pads to {self._buckets}: each bucket compiles on its first batch. Raise"
            " `warmup_steps` to cover every bucket or use fewer, and drop the ragged last batch (`drop_last=True`)"
        )

    def _explain_compile(self, batch: _Batch) -> None:
        for compilation in batch.compiled:
            if compilation.recompile_limit_hit:
                continue  # warned when found
            function = compilation.function or "a function"
            if compilation.failure is not None:
                if self._once(f"failure:{function}"):
                    what = f"tried to compile {function}"
                    rank_zero_warn(
                        f"{self._head(batch, what)} Dynamo failed ({compilation.failure}): it runs uncompiled."
                    )
                continue
            reason, others = compilation.recompile_reason, compilation.other_reasons
            if reason is None:
                kind = f"new:{function}"
                message = f"It compiled {function} for the first time: a code path the warm-up steps did not take."
            else:
                kind = f"reason:{_NUMBERS.sub('N', reason)}"
                also = f" ({len(others)} other cached graph(s) failed too: {'; '.join(others)})" if others else ""
                message = f"Dynamo's reason: {reason}{also}. {_advice(reason, self._padding_advice())}"
            if self._once(kind):
                rank_zero_warn(f"{self._head(batch, f'recompiled {function}')} {message}")

    def _warn_limit(self, compilation: dynamo.Compilation, trainer: pl.Trainer) -> None:
        function = compilation.function or "a compiled function"
        if not self._once(f"limit:{function}"):
            return
        limit = dynamo.recompile_limit()
        rank_zero_warn(
            f"torch.compile hit its recompile limit ({limit} graphs, torch._dynamo.config.recompile_limit) for"
            f" {function} at optimizer step {trainer.global_step}: from now on, inputs that match none of its graphs"
            f" run UNCOMPILED (eager), silently. Last reason: {compilation.recompile_reason}."
            f" {_advice(compilation.recompile_reason or '', self._padding_advice())}"
        )

    def _fallbacks_are_real(self) -> bool:
        return self._lazy is not None and not self._lazy.backend.fallbacks_note

    def _bridge_hint(self) -> str:
        hint = self._lazy.backend.log_hint if self._lazy is not None else None
        return f" Run with {hint} to see the bridge's own log." if hint else ""

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._first_step = trainer.global_step
        self._compile = next((c for c in trainer.callbacks if isinstance(c, HPUCompile)), None)  # type: ignore[attr-defined]
        self._module = pl_module
        if hpu.get_backend().is_lazy():
            self._mode = "lazy"
            self._lazy = _LazyTracker(hpu.get_backend(), lambda: self._phase)
            if self._lazy.sources is not None:
                self._exits.enter_context(self._lazy.sources)
            return
        compile_mode = self._compile is not None or runtime.Runtime.from_env().execution_mode == "compile"
        self._mode = "compile" if compile_mode else "eager"
        if not dynamo.available():
            rank_zero_warn(f"GraphDiagnostics cannot read torch.compile's records: {dynamo.unavailable_reason()}.")
            return
        self._dynamo = _DynamoTracker(self._once)
        self._exits.enter_context(self._dynamo.recorder)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._flush(trainer):
            return
        self._close_batch()
        shapes = batch_shapes(batch)
        new = bool(self._shapes) and shapes not in self._shapes
        epoch_start = batch_idx == 0 and bool(self._shapes)
        self._shapes[shapes] += 1
        self._batch = _Batch(
            batch_idx, trainer.global_step, shapes, new, self._validated, epoch_start, _reads_logged(trainer, batch_idx)
        )
        self._validated = False
        self._phase = "training"

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for loader in CombinedLoader(trainer.train_dataloader).flattened:
            if isinstance(collate := getattr(loader, "collate_fn", None), BucketedPadCollate):
                self._buckets = collate.buckets

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._flush(trainer):
            return
        self._resume_phase = self._phase
        self._phase = "validation"
        self._before_validation = self._compilations["validation"]

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase != "validation" or not self._flush(trainer):
            return
        self._phase = self._resume_phase
        compiled = self._compilations["validation"] - self._before_validation
        if not trainer.sanity_checking:
            self._validated = True
            self._validation_runs += 1
            if compiled and self._validation_runs > 1 and self._once("validation"):
                rank_zero_warn(
                    f"Validation run {self._validation_runs} compiled {compiled} new graph(s) after the first: likely"
                    f" a validation batch of a new shape (a ragged last batch). {self._padding_advice()}."
                    + self._bridge_hint()
                )

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._flush(trainer):
            self._close_batch()
            self._phase = "other"

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._flush(trainer):
            return
        self._close_batch()
        self._exits.close()
        self.summary = self._summarize(trainer)
        self._report(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._exits.close()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._exits.close()  # a failed fit skips teardown

    def _summarize(self, trainer: pl.Trainer) -> dict[str, Any]:
        steps = trainer.global_step - self._first_step
        lazy, compiles = self._lazy, self._dynamo
        counted = compiles if self._mode == "compile" else None
        compiled_graphs = self._compile.graphs() if self._compile is not None and self._compile.compiled else None
        source = ("device" if self._fallbacks_are_real() else "emulator") if lazy and lazy.fallbacks else None
        return {
            "mode": self._mode,
            "warmup_steps": self.warmup_steps,
            "optimizer_steps": steps,
            "graph_compilations": sum(self._compilations.values()),
            "graph_compilations_in_warmup": self._compilations["warmup"],
            "graph_compilations_after_warmup": self._compilations["after_warmup"],
            "validation_graph_compilations": self._compilations["validation"],
            "frames_compiled": counted.frames_compiled if counted is not None else None,
            "recompiles": counted.recompiles if counted is not None else None,
            "recompile_reasons": list(self._reasons),
            "graph_breaks": dict(compiles.breaks) if compiles is not None else {},
            "distinct_input_shapes": len(self._shapes),
            "compilations_by_shape": {str(list(shape)): n for shape, n in self._by_shape.items()},
            **dict.fromkeys(_SYNCS),
            **(lazy.summary(steps) if lazy is not None else {}),
            "cpu_fallbacks": dict(lazy.fallbacks) if lazy is not None else {},
            "cpu_fallbacks_source": source,
            "recompile_limit_hit": compiles is not None and compiles.limit_hit,
            "compiled_graphs": compiled_graphs,
        }

    def _report(self, trainer: pl.Trainer) -> None:
        s = self.summary
        metrics = {f"graph_diagnostics/{key}": float(s[key]) for key in LOGGED_KEYS if s[key] is not None}
        metrics["graph_diagnostics/graph_breaks"] = float(sum(s["graph_breaks"].values()))
        metrics["graph_diagnostics/cpu_fallbacks"] = float(sum(s["cpu_fallbacks"].values()))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        syncs = (
            "not counted here"
            if s["host_syncs"] is None
            else f"{s['host_syncs']} ({s['host_syncs_per_step']:.3f} per optimizer step; {s['host_syncs_by_phase']})"
        )
        fallbacks = ", ".join(f"{op} x{n}" for op, n in Counter(s["cpu_fallbacks"]).most_common()) or "none"
        if s["cpu_fallbacks_source"] == "emulator" and self._lazy is not None:
            fallbacks += f" ({self._lazy.backend.fallbacks_note})"
        frames, recompiles = s["frames_compiled"], s["recompiles"]
        frames = f", from {frames} compiled frames ({recompiles} recompiles)" if frames is not None else ""
        lines = [
            f"Graph diagnostics ({s['mode']} mode) over {s['optimizer_steps']} optimizer steps:"
            f" {s['graph_compilations']} graph compilations ({s['graph_compilations_in_warmup']} in the"
            f" {self.warmup_steps} warm-up steps, {s['graph_compilations_after_warmup']} after,"
            f" {s['validation_graph_compilations']} in validation{frames}); {s['distinct_input_shapes']} distinct input"
            f" shapes; compilations by shape {s['compilations_by_shape'] or 'none'}.",
            f"  recompile reasons: {s['recompile_reasons'] or 'none'}; limit hit: {s['recompile_limit_hit']}.",
            f"  graph breaks: {s['graph_breaks'] or 'none'}; host syncs: {syncs}; CPU fallbacks: {fallbacks}.",
        ]
        for detail in (s["host_sync_source_details"] or [])[:TOP_SYNC_SOURCES]:
            whose = "your code" if detail["user"] else "library"
            lines.append(
                f"  host sync x{detail['count']} at {detail['source']} ({detail['phase']}, {whose}): {detail['code']}"
            )
        if s["compiled_graphs"] is not None:
            lines.append(f"  graphs held by HPUCompile's modules: {s['compiled_graphs']}.")
        rank_zero_info("\n".join(lines) + self._bridge_hint())


def _warn_module_compile_of_torch_modules(pl_module: nn.Module) -> None:
    """``nn.Module.compile()`` on a module made of torch's own modules only compiles nothing, silently: say so."""
    found = [
        f"{name} ({type(m).__name__})"
        for name, m in pl_module.named_modules()
        if name
        and dynamo.compiled_by_module_compile(m)
        and all(type(child).forward.__module__.startswith("torch.") for child in m.modules())
    ]
    if found and dynamo.module_compile_skips_torch_modules():
        rank_zero_warn(
            f"{', '.join(found)} went through `nn.Module.compile()`, which compiles nothing for modules made only of"
            " torch's own (dynamo skips torch's files). Use lightning_gaudi.callbacks.HPUCompile, or compile a module"
            " of your own class."
        )


def _reads_logged(trainer: pl.Trainer, batch_idx: int) -> str | None:
    """Who reads the values logged with ``self.log`` at the end of this batch: the logger, the progress bar or none."""
    every = getattr(trainer, "log_every_n_steps", 0)  # set by Lightning's logger connector
    if trainer.loggers and every and (trainer.global_step + 1) % every == 0:
        return "the logger"
    bar = trainer.progress_bar_callback
    rate = getattr(bar, "refresh_rate", 0) if getattr(bar, "is_enabled", False) else 0
    return "the progress bar" if rate and (batch_idx + 1) % rate == 0 else None


def _advice(reason: str, padding_advice: str = PADDING_ADVICE) -> str:
    if "size mismatch" in reason:
        return (
            f"A dimension changed size: one graph per size (up to its recompile_limit). {padding_advice}; or compile"
            " with dynamic shapes (HPUCompile(dynamic=True); torch's default makes a dimension dynamic on its change)."
        )
    if "training" in reason or "grad_mode" in reason or "is_inference" in reason:
        return "The module switched between training and evaluation (or gradients on and off): one graph each, once."
    return "Something the graph's guards check changed (a Python value, a dtype, a device, a module attribute)."
