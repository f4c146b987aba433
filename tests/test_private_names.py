"""One registry of every private name of torch or Lightning that ``lightning_gaudi`` uses outside ``patches/`` (whose
shims declare theirs in each module's ``PATCH.targets``, with canaries in ``tests/patches/``), each with its canary.

- :func:`test_every_private_name_used_is_registered`: a scan of the package's source finds every private name it uses
  (an attribute, an imported name or module, a name passed to ``getattr``/``hasattr``/``setattr``, a dotted target
  string); each must be in :data:`REGISTRY`. A new use of torch's or Lightning's internals cannot slip in unseen.
- :func:`test_upstream_still_has_it`: the canary. Each entry resolves on the installed torch and Lightning: an object
  by its import path, or an instance attribute by the ``self.<name>`` its class's source sets. When an upgrade moves
  or drops one, this names it, before a user meets an ``AttributeError`` mid-run.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import lightning_gaudi

PACKAGE_DIR = Path(lightning_gaudi.__file__).parent
UPSTREAM = ("torch", "lightning", "lightning_fabric", "pytorch_lightning")

#: name -> where it lives upstream: ``"module:attribute.path"`` (resolved), ``"module:Class#name"`` (an instance
#: attribute that the class's source sets as ``self.<name>``) or ``"module#name"`` (an attribute the module's source
#: sets on objects it makes). A name the package itself sets on ``self`` counts as the package's own.
REGISTRY = {
    # types of Lightning's public extension API, which has no public name for them
    "_AcceleratorRegistry": "lightning.fabric.accelerators.registry:_AcceleratorRegistry",
    "_StrategyRegistry": "lightning.fabric.strategies.registry:_StrategyRegistry",
    "_PATH": "lightning.fabric.utilities.types:_PATH",
    "_DEVICE": "lightning.fabric.utilities.types:_DEVICE",
    # Lightning's internals read by the strategies, the precision plugin and the profiler
    "_after_closure": "lightning.pytorch.plugins.precision:Precision._after_closure",
    "_stage": "lightning.pytorch.profilers:Profiler#_stage",
    "_data_parallel_size": "lightning.pytorch.strategies:ModelParallelStrategy#_data_parallel_size",
    "_tensor_parallel_size": "lightning.pytorch.strategies:ModelParallelStrategy#_tensor_parallel_size",
    "_save_distributed_checkpoint": "lightning.pytorch.strategies:ModelParallelStrategy#_save_distributed_checkpoint",
    # torch: pytree, the op list, DDP's first bucket, dynamo's counters and caches (callbacks/dynamo.py)
    "torch.utils._pytree": "torch.utils._pytree:tree_map",
    "_C": "torch:_C._dispatch_get_all_op_names",
    "_dispatch_get_all_op_names": "torch:_C._dispatch_get_all_op_names",
    "_DEFAULT_FIRST_BUCKET_BYTES": "torch.distributed:_DEFAULT_FIRST_BUCKET_BYTES",
    "_call_impl": "torch.nn:Module._call_impl",
    "_torchdynamo_orig_callable": "torch._dynamo.eval_frame#_torchdynamo_orig_callable",
    "torch._dynamo.utils:counters": "torch._dynamo.utils:counters",
    "torch._dynamo.utils:guard_failures": "torch._dynamo.utils:guard_failures",
    "torch._dynamo.utils:get_compilation_metrics": "torch._dynamo.utils:get_compilation_metrics",
    "torch._dynamo.utils:CompilationMetrics": "torch._dynamo.utils:CompilationMetrics",
    "torch._dynamo.symbolic_convert:graph_break_log": "torch._dynamo.symbolic_convert:graph_break_log",
    "torch._dynamo.eval_frame:_debug_get_cache_entry_list": "torch._dynamo.eval_frame:_debug_get_cache_entry_list",
    "torch._dynamo.config:recompile_limit": "torch._dynamo.config:recompile_limit",
    "torch._dynamo.config:optimize_ddp": "torch._dynamo.config:optimize_ddp",
    # the compile cache policy: torch.compile's own backend wrappers (NodeCompile builds what torch.compile would), the
    # eager backward lowering
    "_TorchCompileInductorWrapper": "torch:_TorchCompileInductorWrapper",
    "_TorchCompileWrapper": "torch:_TorchCompileWrapper",
    "_functorch": "torch._functorch.config:force_non_lazy_backward_lowering",
    # inductor's precompiled C++ headers, carried with the portable artifacts
    "_HEADER_DIR": "torch._inductor.codecache:_HEADER_DIR",
    "torch._inductor": "torch._inductor:codecache",
    # the emulator: batch norm's base class, a Python process group's backends, inductor's compiler, Lazy Tensor Core
    "_BatchNorm": "torch.nn.modules.batchnorm:_BatchNorm",
    "_register_backend": "torch.distributed:ProcessGroup._register_backend",
    "_set_default_backend": "torch.distributed:ProcessGroup._set_default_backend",
    "torch._inductor.cpp_builder": "torch._inductor.cpp_builder:get_cpp_compiler",
    "torch._lazy": "torch._lazy:mark_step",
    "torch._lazy.metrics": "torch._lazy.metrics:counter_names",
    "torch._lazy.ts_backend": "torch._lazy.ts_backend:init",
}
#: Private names of the standard library's public API.
STDLIB = frozenset({"_exit"})
#: Names an older torch lacks, which the package reads through ``getattr``/``hasattr`` and does without: the torch
#: release they are known to be in (absent from 2.7.1, present in 2.10.0; 2.8 and 2.9 not checked).
OPTIONAL_BEFORE = {"_functorch": (2, 10), "_HEADER_DIR": (2, 10)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owned(trees: list[ast.Module]) -> set[str]:
    """Names the package defines itself: functions, classes, variables, ``self.``/``cls.`` attributes."""
    owned = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                owned.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                owned.add(node.id)
            elif isinstance(node, ast.arg):
                owned.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                owned.add(node.attr)
    return owned


def private_uses(tree: ast.Module, owned: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, name)`` for each private upstream name ``tree`` uses (see the module's docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in owned:
            yield node.lineno, node.attr
        elif isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in UPSTREAM and any(_private(part) for part in module.split(".")):
                    yield node.lineno, module
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UPSTREAM:
                yield from ((node.lineno, a.name) for a in node.names if _private(a.name))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) > 1:
            name = node.args[1]
            accessor = node.func.id in ("getattr", "hasattr", "setattr", "delattr") and isinstance(name, ast.Constant)
            if accessor and isinstance(name.value, str) and _private(name.value) and name.value not in owned:
                yield node.lineno, name.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(".")[0] in UPSTREAM:
            parts = node.value.replace(":", ".").split(".")
            if " " not in node.value and len(parts) > 1 and any(_private(part) for part in parts):
                yield node.lineno, node.value


def _package_uses() -> dict[str, list[str]]:
    sources = {
        path: ast.parse(path.read_text())
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if not path.is_relative_to(PACKAGE_DIR / "patches")
    }
    owned = _owned(list(sources.values()))
    found: dict[str, list[str]] = {}
    for path, tree in sources.items():
        for line, name in private_uses(tree, owned):
            found.setdefault(name, []).append(f"{path.relative_to(PACKAGE_DIR.parent)}:{line}")
    return found


def test_the_scan_sees_every_form() -> None:
    tree = ast.parse(
        "from torch.utils._pytree import tree_map\n"
        "import torch._lazy.metrics\n"
        "from lightning.fabric.utilities.types import _PATH\n"
        "x = strategy._data_parallel_size\n"
        "getattr(strategy, '_state_dict_type', None)\n"
        "TARGET = 'torch._dynamo.utils:counters'\n"
        "self._mine = 1\n"
        "y = self._mine\n"
        "'''Docs may say torch._dynamo.config.recompile_limit.'''\n"
    )
    assert sorted(private_uses(tree, _owned([tree]))) == [
        (1, "torch.utils._pytree"),
        (2, "torch._lazy.metrics"),
        (3, "_PATH"),
        (4, "_data_parallel_size"),
        (5, "_state_dict_type"),
        (6, "torch._dynamo.utils:counters"),
    ]


def test_every_private_name_used_is_registered() -> None:
    found = _package_uses()
    assert "_data_parallel_size" in found, "the scan found a known use no more: it is broken"
    unknown = {name: where for name, where in found.items() if name not in REGISTRY and name not in STDLIB}
    assert not unknown, (
        "private names of torch/Lightning used but not in tests/test_private_names.py REGISTRY (register each with"
        f" where it lives upstream, or use a public API): {unknown}"
    )
    unused = sorted(set(REGISTRY) - set(found))
    assert not unused, f"REGISTRY lists names the package no longer uses: {unused}"


def _torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _resolve(target: str) -> Any:
    module_name, _, path = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for attribute in path.split("."):
        found = getattr(found, attribute)
    return found


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_upstream_still_has_it(name: str) -> None:
    target = REGISTRY[name]
    if name in OPTIONAL_BEFORE and _torch_release() < OPTIONAL_BEFORE[name]:
        pytest.skip(f"{target} came after torch {torch.__version__}; the package does without it there")
    if "#" in target and ":" not in target:
        module, _, attribute = target.partition("#")
        assert attribute in inspect.getsource(importlib.import_module(module)), f"{module} no longer sets {attribute}"
    elif "#" in target:
        owner, _, attribute = target.partition("#")
        cls = _resolve(owner)
        sources = "".join(inspect.getsource(k) for k in cls.__mro__ if k.__module__.split(".")[0] in UPSTREAM)
        assert f"self.{attribute}" in sources, f"{owner} no longer sets self.{attribute}: re-check the uses of {name}"
    else:
        try:
            _resolve(target)
        except (ImportError, AttributeError) as error:
            pytest.fail(f"{target} is gone from this torch/Lightning ({error}): re-check the uses of {name}")
