"""Execution modes: HPU graphs for evaluation in lazy mode, ``torch.compile`` in eager (compile) mode."""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_gaudi import compile_cache, hpu
from lightning_gaudi.callbacks import dynamo
from lightning_gaudi.hpu import runtime
from lightning_gaudi.patches import module_forward

EVAL_STAGES = ("validate", "test", "predict")


class HPUGraphs(Callback):
    """Captures the module's forward as an HPU graph for the evaluation ``stages`` in lazy mode (elsewhere it warns and
    does nothing); training runs the plain forward."""

    def __init__(self, stages: Iterable[str] = EVAL_STAGES) -> None:
        self.stages = tuple(stages)
        unknown = [stage for stage in self.stages if stage not in EVAL_STAGES]
        if unknown:
            raise ValueError(f"HPUGraphs got stages {unknown}; choose from {list(EVAL_STAGES)}.")
        self._active = self._captured = self._entered = False
        self._wrapped: Any = None
        self._plain: Any = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._active = hpu.get_backend().is_lazy()
        if not self._active:
            rank_zero_warn("HPUGraphs does nothing outside lazy mode (PT_HPU_LAZY_MODE=1); use HPUCompile there.")

    def _enter(self, stage: str, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active or stage not in self.stages:
            return
        self._entered = True
        self._plain = vars(pl_module).get("forward")
        if not self._captured:
            hpu.get_backend().wrap_in_hpu_graph(pl_module)
            self._captured = True
            self._wrapped = vars(pl_module).get("forward")
        elif self._wrapped is not None:
            module_forward.set_forward(pl_module, self._wrapped)

    def _leave(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._entered:
            return
        self._entered = False
        module_forward.restore_forward(pl_module, self._plain)
        self._plain = None

    on_validation_start = functools.partialmethod(_enter, "validate")
    on_test_start = functools.partialmethod(_enter, "test")
    on_predict_start = functools.partialmethod(_enter, "predict")
    on_validation_end = on_test_end = on_predict_end = _leave


#: What ``HPUCompile`` passes to ``torch.compile`` besides the backend.
COMPILE_OPTIONS = ("dynamic", "fullgraph", "mode", "options")
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _repeated(module: nn.Module) -> bool:
    """A container of repeated blocks: an ``nn.ModuleList``, or an ``nn.Sequential`` of two or more of one class."""
    if isinstance(module, nn.ModuleList):
        return True
    children = list(module.children())
    return isinstance(module, nn.Sequential) and len(children) > 1 and len({type(c) for c in children}) == 1


def _blocks(prefix: str, module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The blocks of the repeated containers in ``module`` (itself, or the outermost below it)."""
    if _repeated(module):
        yield from ((f"{prefix}.{n}", block) for n, block in module.named_children() if _has_parameters(block))
    else:
        for name, child in module.named_children():
            yield from _blocks(f"{prefix}.{name}", child)


def compile_targets(pl_module: nn.Module, regional: bool = False) -> list[tuple[str, nn.Module]]:
    """The modules :class:`HPUCompile` compiles in ``pl_module`` by qualified name: every direct child with parameters
    (or the elements of a child container); with ``regional``, each block of their repeated containers instead."""
    tops: list[tuple[str, nn.Module]] = []
    for name, child in pl_module.named_children():
        if isinstance(child, _CONTAINERS):
            tops += [(f"{name}.{n}", m) for n, m in child.named_children() if _has_parameters(m)]
        elif _has_parameters(child):
            tops.append((name, child))
    if not regional:
        return tops
    return [region for name, top in tops for region in list(_blocks(name, top)) or [(name, top)]]


def _call_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(module).forward(module, *args, **kwargs)


_entries: dict[tuple[type[nn.Module], ...], Callable[..., Any]] = {}


def _entry(module: nn.Module) -> Callable[..., Any]:
    """A frame dynamo traces for the forward of one of torch's own modules (dynamo never starts tracing in torch's
    files), one code object per structure, so modules built alike share their graphs and recompilation count."""
    key = tuple(type(m) for m in module.modules())
    if key not in _entries:
        name = f"{type(module).__name__}_forward"
        code = _call_forward.__code__.replace(co_name=name)  # a new code object, even with the same name
        _entries[key] = types.FunctionType(code, _call_forward.__globals__, name)
    return _entries[key]


class CompiledForward:
    """A module's forward through ``torch.compile``, set as its ``forward`` attribute (names and hooks untouched; a
    deep copy compiles its own; a pickle is uncompiled). ``code``: dynamo's cache key; ``called``: whether it ran."""

    def __init__(self, module: nn.Module, compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._module = module
        self._compile_fn = compile_fn
        plain = type(module).forward
        if plain.__module__.startswith("torch."):
            entry = _entry(module)
            self._compiled: Callable[..., Any] = functools.partial(compile_fn(entry), module)
            self.code = entry.__code__
        else:
            self._compiled = compile_fn(types.MethodType(plain, module))
            self.code = plain.__code__
        self.called = False
        functools.update_wrapper(self, types.MethodType(plain, module))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.called = True
        return self._compiled(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copied = memo.get(id(self._module))
        if copied is None:
            return self
        return CompiledForward(copied, self._compile_fn)

    def __reduce__(self) -> tuple[Any, ...]:
        return _plain_forward, (self._module,)


def _plain_forward(module: nn.Module) -> Callable[..., Any]:
    return types.MethodType(type(module).forward, module)


class HPUCompile(Callback):
    """Compiles the modules the steps call (:func:`compile_targets`) with ``torch.compile`` in eager mode, each
    ``forward`` replaced in place until teardown; in compile mode the HPU strategies add a default one.

    Args:
        regional: compile the repeated blocks instead of the whole child modules (faster cold compile). The blocks
            share their graphs, so what differs per block must stay out of the guards (see ``use_cache``).
        dynamic, fullgraph, mode, options: ``torch.compile``'s (``mode`` and ``options`` exclude each other).
        recompile_limit: graphs one compiled function may hold before further inputs run it uncompiled
            (``torch._dynamo.config.recompile_limit``, set until teardown); ``None`` keeps torch's (8).
        use_cache: the ``use_cache`` Hugging Face model configs in the module read outside ``predict`` (until
            teardown). ``False``: no KV cache, whose per-layer state would put every decoder layer into a graph of
            its own (training never reads it; ``generate`` passes its own). ``None`` leaves the configs alone.
        once_per_node: under the compile cache policy, a node's ranks compile each graph once
            (:class:`~lightning_gaudi.compile_cache.NodeCompile`); ``False``: each rank compiles its own.
    """

    def __init__(
        self,
        regional: bool = False,
        dynamic: bool | None = None,
        fullgraph: bool = False,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
        recompile_limit: int | None = None,
        use_cache: bool | None = False,
        once_per_node: bool = True,
        **compile_kwargs: Any,
    ) -> None:
        if "backend" in compile_kwargs:
            raise ValueError(
                f"HPUCompile picks the backend itself ('hpu_backend' on a Gaudi); got backend="
                f"{compile_kwargs['backend']!r}. Leave it out (in emulation, set {runtime.COMPILE_BACKEND_ENV})."
            )
        if compile_kwargs:
            known = ", ".join(f"`{name}`" for name in COMPILE_OPTIONS)
            raise ValueError(
                f"HPUCompile got unknown argument(s) {sorted(compile_kwargs)}; torch.compile's are {known}."
            )
        for name, value in (("regional", regional), ("fullgraph", fullgraph), ("once_per_node", once_per_node)):
            if not isinstance(value, bool):
                raise ValueError(f"HPUCompile `{name}={value!r}` must be true or false.")
        if dynamic is not None and not isinstance(dynamic, bool):
            raise ValueError(f"HPUCompile `dynamic={dynamic!r}` must be true, false or None (torch's automatic).")
        if mode is not None and options is not None:
            raise ValueError(f"HPUCompile got both `mode={mode!r}` and `options`; torch.compile takes one of them.")
        if recompile_limit is not None and (isinstance(recompile_limit, bool) or not int(recompile_limit) >= 1):
            raise ValueError(f"HPUCompile `recompile_limit={recompile_limit!r}` must be a positive number or None.")
        self.regional, self.dynamic, self.fullgraph, self.mode = regional, dynamic, fullgraph, mode
        self.recompile_limit, self.use_cache, self.once_per_node = recompile_limit, use_cache, once_per_node
        self._restore: list[tuple[Any, str, Any]] = []
        self.options = dict(options) if options is not None else None
        self.compiled: dict[str, CompiledForward] = {}
        self._saved: dict[str, tuple[nn.Module, Any]] = {}
        self._log: dynamo.CompilationLog | None = None
        self._check_pending = False
        self._artifacts_saved: bytes | None = None

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """What is passed to ``torch.compile`` besides the backend."""
        return {"dynamic": self.dynamic, "fullgraph": self.fullgraph, "mode": self.mode, "options": self.options}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        backend = hpu.get_backend()
        if backend.is_lazy():
            raise ValueError(
                "HPUCompile needs eager mode, but the HPU runs in lazy mode. Call lightning_gaudi.configure("
                "execution_mode='compile') before building the Trainer (Hydra, CLI: runtime.execution_mode=compile),"
                " or remove HPUCompile (lazy mode builds graphs itself; HPUGraphs helps evaluation)."
            )
        name = backend.check_compile_backend()
        _check_ddp_buckets(trainer)
        if self.compiled:
            return
        settings: list[tuple[Any, str, Any]] = [(torch._dynamo.config, "recompile_limit", self.recompile_limit)]
        settings = settings if self.recompile_limit else []
        if self.use_cache is not None and stage != "predict":
            configs = {id(c): c for c in (getattr(m, "config", None) for m in pl_module.modules())}
            settings += [(c, "use_cache", self.use_cache) for c in configs.values() if hasattr(c, "use_cache")]
        for target, key, value in settings:
            self._restore.append((target, key, getattr(target, key)))
            setattr(target, key, value)
        targets = compile_targets(pl_module, self.regional)
        if not targets:
            name = type(pl_module).__name__
            rank_zero_warn(f"HPUCompile found nothing to compile: {name} has no child module with parameters.")
            return
        if self.regional and all("." not in path for path, _ in targets):
            rank_zero_warn(
                "HPUCompile(regional=True) found no repeated blocks (an nn.ModuleList of layers) under"
                f" {[path for path, _ in targets]}; compiling them whole."
            )
        compiler = compile_cache.node_backend(name) if self.once_per_node else name
        compile_fn = functools.partial(torch.compile, backend=compiler, **self.compile_kwargs)
        for path, module in targets:
            compiled = CompiledForward(module, compile_fn)
            self._saved[path] = (module, module_forward.set_forward(module, compiled))
            self.compiled[path] = compiled
        self._log = dynamo.CompilationLog()
        self._check_pending = True

    def _batch_done(self, *args: Any, **kwargs: Any) -> None:
        if self._log is None or not dynamo.available():
            return
        compilations = self._log.read()
        if self._check_pending:
            self._check_pending = False
            if not self.graphs() and not any(c.failure is None and c.function for c in compilations):
                rank_zero_warn(self._nothing_compiled_message())
        hit = next((c for c in compilations if c.recompile_limit_hit), None)
        if hit is not None:
            self._log = None  # said once
            rank_zero_warn(self._limit_message(hit))

    def _limit_message(self, hit: dynamo.Compilation) -> str:
        codes = {path: c.code for path, c in self.compiled.items()}
        shared = [p for p, c in codes.items() if f"{c.co_name} ({c.co_filename}:{c.co_firstlineno})" == hit.function]
        head = (
            f"HPUCompile: torch.compile hit its recompile limit ({dynamo.recompile_limit()} graphs) for {hit.function};"
            f" inputs that match none of its graphs now run it UNCOMPILED. Last reason: {hit.recompile_reason}."
        )
        if len(shared) < 2:
            return f"{head} Keep what changes between calls out of its guards (fixed shapes, dynamic=True)."
        return (
            f"{head} Its {len(shared)} blocks ({shared[0]} to {shared[-1]}) share that code, but something per block"
            " is in the guards: in a Hugging Face decoder the KV cache (use_cache=True). Use HPUCompile(use_cache="
            f"False), the default, or a recompile_limit of at least {len(shared)} per train/eval variant."
        )

    def graphs(self) -> int:
        """The compiled graphs dynamo holds for the compiled modules (modules built alike share theirs)."""
        codes = {id(compiled.code): compiled.code for compiled in self.compiled.values()}  # equal code compares equal
        return sum(dynamo.cache_entries(code) for code in codes.values())

    def _nothing_compiled_message(self) -> str:
        called = [path for path, compiled in self.compiled.items() if compiled.called]
        head = f"HPUCompile compiled no graph in the first step: it compiled {sorted(self.compiled)}, and"
        if not called:
            return (
                f"{head} the step called none of their forwards (only the module call, `self.model(x)`, runs compiled;"
                " not `self.model.generate(...)`). Call the module, or compile that method yourself."
            )
        return (
            f"{head} their forwards ran ({sorted(called)}) but dynamo compiled no frame: is torch.compile disabled"
            " (TORCHDYNAMO_DISABLE=1), or did every frame fail to compile (see the log)?"
        )

    on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _batch_done

    @staticmethod
    def _artifacts(trainer: pl.Trainer, resumed: bool) -> Path | None:
        """The portable compile artifacts beside the resumed checkpoint (or the checkpoint folder), if local."""
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        if resumed and trainer.ckpt_path:
            dirpath = os.path.dirname(trainer.ckpt_path)
        return compile_cache.strategy_artifacts(dirpath, trainer.strategy)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        path = self._artifacts(trainer, resumed=True)
        if path is not None and (loaded := compile_cache.load_artifacts(path)) is not None:
            self._artifacts_saved = loaded  # saved again only once this run compiled more

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        path = self._artifacts(trainer, resumed=False) if trainer.is_global_zero else None
        if path is not None and self.compiled:
            self._artifacts_saved = compile_cache.save_artifacts(path, unless=self._artifacts_saved)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "exception")  # a failed run skips teardown: put the plain forwards back

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for module, previous in self._saved.values():
            module_forward.restore_forward(module, previous)
        self._saved.clear()
        for target, key, value in reversed(self._restore):
            setattr(target, key, value)
        self._restore.clear()
        self.compiled.clear()
        self._log = None
        self._check_pending = False


def _check_ddp_buckets(trainer: pl.Trainer) -> None:
    """Raises before training when dynamo's DDPOptimizer would fail on the strategy's ``bucket_cap_mb``."""
    ddp_kwargs = getattr(trainer.strategy, "ddp_kwargs", None)
    if not isinstance(ddp_kwargs, dict) or ddp_kwargs.get("bucket_cap_mb") is None:
        return
    first = dynamo.ddp_first_bucket_bytes()
    cap_mb = ddp_kwargs["bucket_cap_mb"]
    if first is None or int(cap_mb * 1024 * 1024) >= first:
        return
    raise ValueError(
        f"HPUCompile with `bucket_cap_mb={cap_mb}` would fail in the first step: torch.compile's DDPOptimizer needs"
        f' the first bucket ({first / 2**20:g} MB) to be no larger than the others ("First bucket should be'
        f' smaller/equal to other buckets"). Set `bucket_cap_mb` to at least {first / 2**20:g}, or train uncompiled.'
    )


def add_default_compile(trainer: pl.Trainer) -> HPUCompile | None:
    """In compile mode, puts a default :class:`HPUCompile` first in ``trainer.callbacks`` unless one is configured."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    if any(isinstance(c, HPUCompile) for c in callbacks) or runtime.Runtime.from_env().execution_mode != "compile":
        return None
    callback = HPUCompile()
    callbacks.insert(0, callback)
    return callback
