"""Reading what ``torch.compile`` records about itself (compilations, recompile reasons, graph breaks, caches) from
dynamo's private records (:data:`TARGETS`, the loggers named below); this module patches nothing and imports nothing
before it is needed. Where a target is missing, :func:`available` is ``False``, every reader returns nothing, and
callers say what they cannot report and why. ``tests/callbacks/test_dynamo.py`` holds the canaries (docs/compat.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from typing_extensions import Self

#: Every private target, as ``module:attribute``; :func:`missing_targets` resolves them.
TARGETS = (
    "torch._dynamo.utils:counters",
    "torch._dynamo.utils:guard_failures",
    "torch._dynamo.utils:get_compilation_metrics",
    "torch._dynamo.utils:CompilationMetrics",
    "torch._dynamo.symbolic_convert:graph_break_log",
    "torch._dynamo.eval_frame:_debug_get_cache_entry_list",
    "torch._dynamo.config:recompile_limit",
    "torch._dynamo.config:optimize_ddp",
)
#: The fields of ``CompilationMetrics`` that are read.
METRIC_FIELDS = ("co_name", "co_filename", "co_firstlineno", "recompile_reason", "fail_type", "fail_reason")
#: Where ``nn.Module.compile()`` keeps the compiled call.
MODULE_COMPILE_ATTRIBUTE = "_compiled_call_impl"
#: How dynamo's failure reason starts when a function hit the recompile limit (torch 2.11 and newer).
RECOMPILE_LIMIT_REASON = "Dynamo recompile limit exceeded"
#: The failure of a function that hit the limit, on every torch of the matrix.
_LIMIT_HIT = re.compile(rf"^({RECOMPILE_LIMIT_REASON}|\w*(recompile|cache_size)_limit reached)")

_REASON_PREFIX = re.compile(r"^\d+/(\d+): ")
#: Guards that fail because the module switched mode: the graph of the other mode was checked first, not the cause.
_MODE_GUARD = re.compile(r"grad_mode|\.training\b|is_inference")
_GRAPH_BREAK = re.compile(r"in user code at (?P<where>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*)", re.S)
_ENCOUNTERED = "Encountered graph break when attempting to trace"


def _resolve(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@functools.cache
def _counters() -> Any:
    return _resolve("torch._dynamo.utils:counters")  # one dict for the life of the process (reset clears it)


def missing_targets() -> list[str]:
    """The targets this torch lacks; empty when every one resolves."""
    missing = []
    for target in TARGETS:
        try:
            _resolve(target)
        except (ImportError, AttributeError):
            missing.append(target)
    if not missing:
        fields = _resolve("torch._dynamo.utils:CompilationMetrics").__dataclass_fields__
        missing += [f"CompilationMetrics.{name}" for name in METRIC_FIELDS if name not in fields]
    return missing


@functools.cache
def _unavailable() -> str | None:
    missing = missing_targets()
    return f"this torch lacks {', '.join(missing)}" if missing else None


def available() -> bool:
    """Whether torch.compile's records can be read on this torch."""
    return _unavailable() is None


def unavailable_reason() -> str:
    """Why :func:`available` is ``False`` (empty when it is ``True``)."""
    return _unavailable() or ""


def frames_started() -> int:
    """How many frames dynamo has been asked to compile in this process (cache hits do not count)."""
    if not available():
        return 0
    return int(_counters()["frames"]["total"])


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process (forward graphs only)."""
    return int(_counters()["stats"]["unique_graphs"]) if available() else 0


def recompile_limit() -> int | None:
    """``torch._dynamo.config.recompile_limit``: graphs one function may hold before it runs uncompiled."""
    return int(_resolve("torch._dynamo.config:recompile_limit")) if available() else None


def cache_entries(code_or_fn: Any) -> int:
    """How many compiled graphs dynamo holds for a code object (or a function's or method's code)."""
    if not available():
        return 0
    code = getattr(code_or_fn, "__code__", code_or_fn)
    return len(_resolve("torch._dynamo.eval_frame:_debug_get_cache_entry_list")(code))


def ddp_first_bucket_bytes() -> int | None:
    """The first-bucket size DDPOptimizer requires ``bucket_cap_mb`` to reach; ``None`` when it is off."""
    if not available():
        return None
    mode = _resolve("torch._dynamo.config:optimize_ddp")
    if mode is False or (isinstance(mode, str) and mode != "ddp_optimizer"):
        return None
    import torch.distributed

    return int(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def compiled_by_module_compile(module: Any) -> bool:
    """Whether ``module.compile()`` was called (``nn.Module`` keeps the result in ``_compiled_call_impl``)."""
    return getattr(module, MODULE_COMPILE_ATTRIBUTE, None) is not None


@functools.cache
def module_compile_skips_torch_modules() -> bool:
    """Whether ``nn.Module.compile()`` compiles nothing for a module made only of torch's own (dynamo skips torch's
    files; torch 2.14 gives such a call a frame of its own): read, without compiling, off an ``nn.Linear``."""
    import torch

    compiled = torch.compile(torch.nn.Linear(1, 1)._call_impl, backend="eager")
    kept = getattr(compiled, "_torchdynamo_orig_callable", None)
    return getattr(kept, "__code__", None) in (None, torch.nn.Module._call_impl.__code__)


@dataclass(frozen=True)
class Compilation:
    """One frame dynamo compiled (or tried to): the function (``"forward (model.py:12)"``), the most relevant failed
    guard of the cached graphs (``None`` for a first compilation) and the others', why it failed, and whether the
    function already held ``recompile_limit`` graphs (this input runs uncompiled)."""

    function: str | None
    recompile_reason: str | None
    failure: str | None
    recompile_limit_hit: bool
    other_reasons: tuple[str, ...] = ()


def _first_line(reason: str) -> str:
    return _REASON_PREFIX.sub("", reason.strip().splitlines()[0])


def _compilation(record: Any) -> Compilation:  # a CompilationMetrics: every field of METRIC_FIELDS is there
    function = f"{record.co_name} ({record.co_filename}:{record.co_firstlineno})" if record.co_name else None
    reason = _first_line(record.recompile_reason) if record.recompile_reason else None
    fail_reason = (record.fail_reason or "").strip()
    fail_type = record.fail_type
    failure = f"{fail_type}: {fail_reason.splitlines()[0] if fail_reason else ''}".strip() if fail_type else None
    limit_hit = fail_type == "RecompileLimitExceeded" or _LIMIT_HIT.match(fail_reason) is not None
    return Compilation(function, reason, failure, limit_hit)


class CompilationLog:
    """The frames compiled since the log was made (or last read), in order; dynamo keeps its last 64 records."""

    def __init__(self) -> None:
        self._last: Any = None
        self._functions: dict[str, str] = {}  # frame id -> function: a limit record lacks the code on torch < 2.11
        self._failures_seen: dict[Any, int] = {}
        if available():
            records = _resolve("torch._dynamo.utils:get_compilation_metrics")()
            self._last = records[-1] if records else None
            self._guard_failures()

    def _guard_failures(self) -> dict[str, list[list[str]]]:
        """The failed guards of each recompile since the last call, by function, one list per recompile."""
        found: dict[str, list[list[str]]] = {}
        for code, reasons in list(_resolve("torch._dynamo.utils:guard_failures").items()):
            start = self._failures_seen.get(code, 0)
            self._failures_seen[code] = len(reasons)
            recompiles: list[list[str]] = []
            last = -1
            for reason in reasons[start if start <= len(reasons) else 0 :]:
                entry = int(match[1]) if (match := _REASON_PREFIX.match(reason)) else -1
                if entry < 0 or last < 0 or entry >= last:  # one recompile checks its cached graphs newest first
                    recompiles.append([])
                recompiles[-1].append(_first_line(reason))
                last = entry
            found[f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"] = recompiles
        return found

    def read(self) -> list[Compilation]:
        """The compilations of forward frames recorded since the last read (backward graphs are not frames)."""
        if not available():
            return []
        records = _resolve("torch._dynamo.utils:get_compilation_metrics")()
        start = next((index + 1 for index in reversed(range(len(records))) if records[index] is self._last), 0)
        if records:
            self._last = records[-1]
        failures = self._guard_failures()
        found = []
        for record in records[start:]:
            if getattr(record, "is_forward", None) is False or getattr(record, "is_runtime", False):
                continue
            compilation = _compilation(record)
            frame = str(getattr(record, "compile_id", None) or "").strip("[]").split("/")[0]
            if compilation.function is not None:
                self._functions[frame] = compilation.function
            elif frame in self._functions:
                compilation = dataclasses.replace(compilation, function=self._functions[frame])
            reasons = failures.get(compilation.function or "") or [[]]
            if compilation.recompile_reason and reasons[0]:
                first, *others = sorted(reasons.pop(0), key=lambda reason: _MODE_GUARD.search(reason) is not None)
                compilation = dataclasses.replace(compilation, recompile_reason=first, other_reasons=tuple(others))
            found.append(compilation)
        return found


@dataclass(frozen=True)
class GraphBreak:
    """Where (the user's ``"model.py:18"``) and why (dynamo's reason and explanation) dynamo split a graph."""

    location: str
    reason: str


def _graph_break(message: str) -> GraphBreak | None:
    match = _GRAPH_BREAK.search(message)
    if match is None:
        return None
    lines = [line.strip() for line in match["reason"].splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(_ENCOUNTERED)] or lines or ["unknown reason"]
    reason = lines[0]
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    if explanation is not None:
        reason = f"{reason}: {explanation.removeprefix('Explanation:').strip()}"
    return GraphBreak(f"{match['where']}:{match['line']}", reason)


class _LogRecorder(logging.Handler):
    """Collects what ``parse`` finds in the records of dynamo's logger ``_target`` at ``level`` while started,
    without printing them (unless ``TORCH_LOGS`` enabled them); the last recorder of its class restores the logger."""

    _target: ClassVar[str]
    _active: ClassVar[int] = 0
    _saved: ClassVar[tuple[int, bool] | None] = None

    def __init__(self, level: int, parse: Callable[[str], Any], sink: Callable[[Any], None]) -> None:
        super().__init__(level)
        self._parse, self._sink = parse, sink
        self._started = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            found = self._parse(record.getMessage())
        except Exception:  # a record this torch formats differently is skipped, never raised into dynamo
            return
        if found is not None:
            self._sink(found)

    def start(self) -> None:
        """Starts recording (idempotent); does nothing where :func:`available` is ``False``."""
        if self._started or not available():
            return
        logger = _resolve(self._target)
        cls = type(self)
        if cls._active == 0 and not logger.isEnabledFor(self.level):
            cls._saved = (logger.level, logger.propagate)
            logger.setLevel(self.level)
            logger.propagate = False
        cls._active += 1
        logger.addHandler(self)
        self._started = True

    def stop(self) -> None:
        """Stops recording and, with the last recorder, restores the logger."""
        if not self._started:
            return
        logger = _resolve(self._target)
        logger.removeHandler(self)
        self._started = False
        cls = type(self)
        cls._active -= 1
        if cls._active == 0 and cls._saved is not None:
            logger.setLevel(cls._saved[0])
            logger.propagate = cls._saved[1]
            cls._saved = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GraphBreakRecorder(_LogRecorder):
    """Collects dynamo's graph breaks with their source lines (logged at ``DEBUG``) in :attr:`breaks`."""

    _target = "torch._dynamo.symbolic_convert:graph_break_log"

    def __init__(self) -> None:
        self.breaks: list[GraphBreak] = []
        super().__init__(logging.DEBUG, _graph_break, self.breaks.append)
