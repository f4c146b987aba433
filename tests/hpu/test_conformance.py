"""The bridge double, the CPU emulator, the adapter and (where installed) Intel's packages held to
docs/conformance.md, the table of names, signatures, structures, variables, constants and error texts read from
Intel's sources; and each row's quoted excerpt held to the source it cites, where that source is on the machine."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.emulator.eager import EagerBackend
from lightning_gaudi.hpu import autocast_lists, deepspeed_accelerator, runtime
from lightning_gaudi.hpu.backend import MEMORY_STAT_KEYS

TABLE = Path(__file__).parents[2] / "docs" / "conformance.md"
SECTIONS = ("signatures", "structures", "environment", "constants", "errors")

#: Where the repositories of the sources table are mirrored (bare git repositories); absent on CI machines.
MIRRORS = {
    "B": Path("/work/.mirror/HabanaAI+gaudi-pytorch-bridge/repo"),
    "D": Path("/work/.mirror/HabanaAI+DeepSpeed/repo"),
}
#: What a row's path is relative to, per source (a bridge path starting with "/" is from the repository root).
PATH_PREFIX = {"B": "python_packages/habana_frameworks/torch/", "D": "", "I": "neural_compressor/torch/"}
#: How far from the cited line a quoted excerpt may be.
QUOTE_WINDOW = 5


class Row(NamedTuple):
    """One table row: ``value`` as written, ``source`` (``KEY:path:line``) and the quoted excerpts."""

    value: str
    source: str
    quotes: tuple[str, ...]


def _cells(line: str) -> list[str]:
    """A table line's cells, split at pipes not escaped as ``\\|``."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def read_table(section: str) -> dict[str, Row]:
    """The rows after ``<!-- conformance:<section> -->``: name -> :class:`Row` (``sources``: key -> its cells)."""
    lines = TABLE.read_text().splitlines()
    start = lines.index(f"<!-- conformance:{section} -->") + 3  # the marker, the header, the rule
    rows: dict[str, Row] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        if section == "sources":
            assert len(cells) == 4, line
            rows[cells[0]] = Row(cells[2], cells[3], ())
            continue
        assert len(cells) == 4, line
        assert cells[0] not in rows, f"{section}: {cells[0]} twice"
        rows[cells[0]] = Row(cells[1], cells[2], tuple(re.findall(r"`([^`]+)`", cells[3])))
    return rows


SIGNATURES = read_table("signatures")
STRUCTURES = read_table("structures")
ENVIRONMENT = read_table("environment")
CONSTANTS = read_table("constants")
ERRORS = read_table("errors")
SOURCES = read_table("sources")
TABLES = dict(zip(SECTIONS, (SIGNATURES, STRUCTURES, ENVIRONMENT, CONSTANTS, ERRORS), strict=True))


class Citation(NamedTuple):
    key: str
    path: str  # from the root of the repository or package
    line: int


def citation(source: str) -> Citation:
    """``"B:/backend/x.cpp:64"`` -> ``Citation("B", "backend/x.cpp", 64)``; ``"B:hpu/memory.py:77"`` -> the path
    under ``python_packages/habana_frameworks/torch/``."""
    key, _, rest = source.partition(":")
    path, _, line = rest.rpartition(":")
    assert key in PATH_PREFIX, f"{source}: unknown source key"
    assert path, f"{source}: expected KEY:path:line"
    assert line.isdigit(), f"{source}: expected KEY:path:line"
    path = path[1:] if key == "B" and path.startswith("/") else PATH_PREFIX[key] + path
    return Citation(key, path, int(line))


# Names the lead wires to code that lands later (the HCCL rules, the out-of-memory wording): each reads the table.


def listed(section: str, name: str) -> tuple[str, ...]:
    """A comma-separated value as a tuple, less a trailing parenthesis: ``"MIN, MAX (...)"`` -> ``("MIN", "MAX")``."""
    value = re.sub(r"\s*\([^()]*\)$", "", TABLES[section][name].value)
    return tuple(part.strip() for part in value.split(","))


def hccl_reduce_ops() -> tuple[str, ...]:
    """The ``torch.distributed.ReduceOp`` names HCCL accepts (bridge 1.19)."""
    return listed("constants", "HCCL reduce ops")


def hccl_dtypes() -> tuple[torch.dtype, ...]:
    """The tensor dtypes HCCL accepts (bridge 1.19), fp8 included."""
    names = listed("constants", "HCCL tensor dtypes") + listed("constants", "HCCL fp8 tensor dtypes")
    return tuple(getattr(torch, name) for name in names)


def error_text(name: str) -> str:
    """An error row's message, without its exception class (placeholders such as ``<dtype>`` kept)."""
    return ERRORS[name].value.partition(": ")[2]


def error_pattern(name: str) -> re.Pattern[str]:
    """An error row's message as a regular expression, each ``<placeholder>`` matching any text."""
    parts = re.split(r"<[^<>]+>", error_text(name))
    return re.compile(".+?".join(re.escape(part) for part in parts))


def split_parameters(signature: str) -> list[str]:
    """``"(a, b=(1, 2), *, c={'x': 1})"`` -> ``["a", "b=(1, 2)", "*", "c={'x': 1}"]`` (top-level commas only)."""
    assert signature.startswith("("), signature
    assert signature.endswith(")"), signature
    parts, depth, quote, current = [], 0, "", ""
    for char in signature[1:-1]:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def assert_same_signature(found: str, expected: str) -> None:
    """Equal parameter lists; a default written ``...`` in ``expected`` matches any default."""
    found_parts, expected_parts = split_parameters(found), split_parameters(expected)
    assert len(found_parts) == len(expected_parts), f"{found} != {expected}"
    for got, want in zip(found_parts, expected_parts, strict=True):
        if want.endswith("=..."):
            assert "=" in got, f"{got} has no default in {found}"
            assert got.partition("=")[0] == want[:-4], f"{got} != {want} in {found}"
        else:
            assert got == want, f"{got} != {want} in {found}"


def resolve(name: str) -> Any:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def test_every_row_cites_a_line_and_quotes_it() -> None:
    assert set(SOURCES) == {"B", "D", "I", "G"}
    for key in ("B", "D"):
        assert re.fullmatch(r"[0-9a-f]{40}", SOURCES[key].source), SOURCES[key]
    for section, rows in TABLES.items():
        for name, row in rows.items():
            if row.source.startswith("G:"):  # Intel's documentation: a page, no line, nothing to quote
                continue
            cited = citation(row.source)
            assert cited.line >= 1, f"{section} {name}: {row.source}"
            assert row.quotes, f"{section} {name}: no quoted excerpt"
            assert all(len(quote) <= 120 for quote in row.quotes), f"{section} {name}: quote facts, not prose"


@functools.cache
def _mirrored_file(key: str, path: str) -> list[str] | None:
    """The cited file at the recorded commit, read from the mirror; ``None`` where the file is not there."""
    done = subprocess.run(
        ["git", "--git-dir", str(MIRRORS[key]), "show", f"{SOURCES[key].source}:{path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.splitlines() if done.returncode == 0 else None


def _source_lines(cited: Citation) -> list[str]:
    """The cited file's lines, or a skip saying why it cannot be read here."""
    if cited.key == "I":
        spec = importlib.util.find_spec("neural_compressor")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("Intel Neural Compressor is not installed (pip install neural-compressor-pt==3.10)")
        root = Path(next(iter(spec.submodule_search_locations))).parent
        if "bridge_double" in str(root):
            pytest.skip("only the double of Intel Neural Compressor is importable")
        file = root / cited.path
        assert file.is_file(), f"{file} is not in the installed Intel Neural Compressor"
        return file.read_text().splitlines()
    mirror = MIRRORS[cited.key]
    if not mirror.is_dir():
        pytest.skip(f"source {cited.key}: its repository is not mirrored at {mirror} (not on CI machines)")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    lines = _mirrored_file(cited.key, cited.path)
    assert lines is not None, f"{cited.path} is not in {mirror} at {SOURCES[cited.key].source}"
    return lines


def _normalized(text: str) -> str:
    return " ".join(text.split())


QUOTED = [(section, name) for section, rows in TABLES.items() for name, row in rows.items() if row.quotes]


@pytest.mark.parametrize(("section", "name"), QUOTED, ids=[f"{section}:{name}" for section, name in QUOTED])
def test_quotes_occur_near_the_cited_line(section: str, name: str) -> None:
    """Each excerpt of a row is in the cited file, at the recorded commit, within QUOTE_WINDOW lines of the cited
    line (an excerpt may run over several lines: whitespace is compared collapsed)."""
    row = TABLES[section][name]
    cited = citation(row.source)
    lines = _source_lines(cited)
    assert cited.line <= len(lines), f"{row.source}: the file has {len(lines)} lines"
    window = lines[max(cited.line - 1 - QUOTE_WINDOW, 0) : cited.line + QUOTE_WINDOW]
    text = _normalized(" ".join(window))
    missing = [quote for quote in row.quotes if _normalized(quote) not in text]
    assert not missing, f"{section} {name}: {missing} not within {QUOTE_WINDOW} lines of {row.source}"


def test_the_bridge_commit_is_the_tag() -> None:
    if not MIRRORS["B"].is_dir() or shutil.which("git") is None:
        pytest.skip(f"the bridge is not mirrored at {MIRRORS['B']} (not on CI machines), or git is missing")
    tag = re.match(r"tag (v[0-9.]+)", SOURCES["B"].value)
    assert tag is not None, SOURCES["B"].value
    done = subprocess.run(
        ["git", "--git-dir", str(MIRRORS["B"]), "rev-parse", f"{tag[1]}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip() == SOURCES["B"].source, done.stderr


def test_the_wiring_helpers_read_the_table() -> None:
    """What the HCCL and out-of-memory checks will read (wired when that code lands)."""
    assert hccl_reduce_ops() == ("MIN", "MAX", "SUM", "PRODUCT")
    assert all(
        isinstance(getattr(torch.distributed.ReduceOp, op), torch.distributed.ReduceOp.RedOpType)
        for op in hccl_reduce_ops()
    )
    assert {torch.bool, torch.bfloat16, torch.float8_e4m3fn} <= set(hccl_dtypes())
    assert torch.int16 not in hccl_dtypes()
    assert error_text("HCCL reduce op not supported") == "Unsupported ReduceOp for HCCL process group"
    dtype = error_pattern("HCCL dtype not supported")
    assert dtype.fullmatch("Input tensor data type is not supported for HCCL process group: Short")
    oom = error_pattern("device out of memory")
    assert oom.fullmatch("[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1024 (0.0009765625)MB")
    assert not oom.fullmatch("CUDA out of memory")


def test_the_plugin_asks_hccl_only_for_its_reductions() -> None:
    """Every reduction the strategies pass to HCCL is one it has, but AVG, which the core turns into a sum divided
    by the world size before HCCL sees it."""
    from lightning_gaudi.strategies.core import HCCL_OPS

    ops = torch.distributed.ReduceOp
    for name, op in HCCL_OPS.items():
        if op == ops.AVG:
            continue
        assert any(op == getattr(ops, known) for known in hccl_reduce_ops()), name


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_the_double_has_intels_signatures(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(runtime.LAZY_MODE_ENV, "1")  # wrap_in_hpu_graph exists in lazy mode only
    bridge_double.configure(lazy=None)
    assert_same_signature(str(inspect.signature(resolve(name))), SIGNATURES[name][0])


def test_hpu_graphs_exist_only_in_lazy_mode(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import habana_frameworks.torch.hpu as double_hpu

    bridge_double.configure(lazy=False)
    assert not hasattr(double_hpu, "wrap_in_hpu_graph")
    bridge_double.configure(lazy=True)
    assert callable(double_hpu.wrap_in_hpu_graph)


def _listed(row: str) -> tuple[str, ...]:
    return listed("structures", row)


def test_memory_stats_keys_are_intels(bridge_double: ModuleType, eager_hpu: hpu.Backend) -> None:
    keys = _listed("habana_frameworks.torch.hpu.memory_stats() keys")
    assert keys == MEMORY_STAT_KEYS
    assert tuple(bridge_double.MEMORY_STAT_KEYS) == keys
    assert tuple(eager_hpu.memory_stats()) == keys
    assert tuple(EagerBackend(2, "GAUDI3").memory_stats()) == keys  # the emulator, whatever the generation


def test_mem_get_info_is_limit_less_in_use(bridge_double: ModuleType) -> None:
    import habana_frameworks.torch.hpu as double_hpu

    assert STRUCTURES["habana_frameworks.torch.hpu.mem_get_info()"].value == "(Limit - InUse, Limit)"
    bridge_double.configure(memory={"Limit": 100, "InUse": 30})
    assert tuple(double_hpu.mem_get_info()) == (70, 100)


def test_mark_step_as_callers_see_it(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Intel's ``mark_step`` shows ``(*args, **kwargs)`` (``lazy_only`` has no ``functools.wraps``) and does nothing
    outside lazy mode; the adapter calls it without arguments, which binds to both forms, and so does the emulator's
    eager backend (not lazy, ``mark_step`` a no-op)."""
    import habana_frameworks.torch.core as core

    shown = STRUCTURES["habana_frameworks.torch.core.mark_step as inspect.signature shows it"].value
    wrapped = SIGNATURES["habana_frameworks.torch.core.mark_step"].value
    assert shown == "(*args, **kwargs)"
    for parameters in (shown, wrapped):
        inspect.signature(eval(f"lambda {parameters[1:-1]}: None")).bind()  # what the adapter passes: nothing
    adapter = inspect.getsource(importlib.import_module("lightning_gaudi.hpu.bridge"))
    assert re.findall(r"_core\.mark_step\((.*?)\)", adapter) == [""]

    launched: list[bool] = []
    monkeypatch.setattr(bridge_double, "launch_graph", lambda: launched.append(True))
    assert "does nothing" in STRUCTURES["habana_frameworks.torch.core.mark_step outside lazy mode"].value
    bridge_double.configure(lazy=False)
    assert core.mark_step() is None
    assert not launched
    bridge_double.configure(lazy=True)
    core.mark_step()
    assert launched == [True]

    emulator = EagerBackend(1, "GAUDI2")
    assert not emulator.is_lazy()
    assert emulator.mark_step() is None


@pytest.mark.parametrize("metric", ["graph_compilation", "cpu_fallback", "memory_defragmentation", "recipe_cache"])
def test_metric_tags_are_intels(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch, metric: str) -> None:
    from habana_frameworks.torch.hpu.metrics import metric_global

    monkeypatch.setenv("PT_HPU_ENABLE_CACHE_METRICS", "On")  # the source's truth values, in any case
    tags = _listed(f"metric_global('{metric}').stats() tags")
    assert tuple(tag for tag, _ in metric_global(metric).stats()) == tags


def test_the_adapter_reads_tags_that_exist() -> None:
    source = inspect.getsource(importlib.import_module("lightning_gaudi.hpu.bridge"))
    reads = re.findall(r'metric_global\("(\w+)"\), "(\w+)"', source) + re.findall(r'_stat\(fallback, "(\w+)"', source)
    assert reads, "the adapter's metric reads were not found"
    assert ("graph_compilation", "TotalNumber") in reads
    assert "TotalNumber" in _listed("metric_global('graph_compilation').stats() tags")
    assert "FallbackOps" in _listed("metric_global('cpu_fallback').stats() tags")
    assert 'fallback = metric_global("cpu_fallback")' in source


def test_unknown_metrics_and_disabled_cache_metrics_are_none(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from habana_frameworks.torch.hpu.metrics import metric_global

    monkeypatch.delenv("PT_HPU_ENABLE_CACHE_METRICS", raising=False)
    assert metric_global("no_such_metric") is None
    assert metric_global("recipe_cache") is None


def test_initialize_distributed_hpu_behaves_as_the_source(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # recorded, so monkeypatch restores it after the double exports it
        monkeypatch.delenv(name)
    assert len(_listed("initialize_distributed_hpu() returns")) == 3
    assert initialize_distributed_hpu(world_size=4, rank=2, local_rank=1) == (4, 2, 1)
    assert "MASTER_ADDR" not in __import__("os").environ  # only the launcher-less path defaults it
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("LOCAL_RANK")
    assert initialize_distributed_hpu() == (4, -1, -1)
    assert __import__("os").environ["MASTER_PORT"] == "12345"


def test_the_adapters_positional_kernel_calls_bind_to_intels_parameters(bridge_double: ModuleType) -> None:
    """``Backend.sdpa``/``rms_norm``/``rope`` pass arguments by position: each lands on the parameter it means."""

    def bound(name: str, *args: Any) -> dict[str, Any]:
        params = [p.split("=")[0] for p in split_parameters(SIGNATURES[name][0])]
        return dict(zip(params, args, strict=False))

    backend = hpu.get_backend()
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    backend.sdpa(q, k, v, is_causal=True, scale=0.5, recompute=True)
    (call,) = bridge_double.called("hpex.FusedSDPA.apply")
    sdpa_args = (q, k, v, None, 0.0, True, 0.5, "None", True)
    assert bound("habana_frameworks.torch.hpex.kernels.FusedSDPA.apply", *sdpa_args)["recompute_mode"] is True
    assert (call.kwargs["is_causal"], call.kwargs["scale"], call.kwargs["softmax_mode"]) == (True, 0.5, "None")
    assert call.kwargs["recompute_mode"] is True

    x, weight = torch.randn(2, 8), torch.ones(8)
    backend.rms_norm(x, weight, 1e-5)
    assert bridge_double.called("hpex.FusedRMSNorm.apply")[0].kwargs["eps"] == 1e-5
    assert bound("habana_frameworks.torch.hpex.normalization.FusedRMSNorm.apply", x, weight, 1e-5)["eps"] == 1e-5

    cos, sin = torch.randn(4, 8), torch.randn(4, 8)
    backend.rope(q, cos, sin)
    assert bridge_double.called("hpex.RotaryPosEmbeddingHelperV1.apply")[0].kwargs["offset"] == 0
    assert bound("habana_frameworks.torch.hpex.kernels.RotaryPosEmbeddingHelperV1.apply", q, cos, sin, 0)["offset"] == 0


#: Facts of the table the CPU emulator cannot share, and what it uses instead (there is no HCCL or hpu_backend on a
#: CPU): row -> (the emulator's attribute, its stand-in).
EMULATOR_STAND_INS = {
    "torch.compile backend name": ("compile_backend", runtime.DEFAULT_EMULATED_COMPILE_BACKEND),
}


def test_names_the_adapter_uses_are_intels(bridge_double: ModuleType, clean_hpu_env: pytest.MonkeyPatch) -> None:
    backend = hpu.get_backend()
    assert backend.collective_backend == STRUCTURES["hccl process-group backend name"][0]
    assert backend.compile_backend == STRUCTURES["torch.compile backend name"][0]
    assert backend.compile_backend == STRUCTURES["DeepSpeed HPU_Accelerator compile backend"][0]
    clean_hpu_env.delenv(runtime.COMPILE_BACKEND_ENV, raising=False)
    emulator = EagerBackend(1, "GAUDI2")
    assert emulator.collective_backend == STRUCTURES["hccl process-group backend name"][0]  # gloo behind HCCL's rules
    for row, (attribute, stand_in) in EMULATOR_STAND_INS.items():
        assert getattr(emulator, attribute) == stand_in != STRUCTURES[row].value, row
    assert (
        deepspeed_accelerator.deepspeed_accelerator_name(backend)
        == STRUCTURES["DeepSpeed HPU_Accelerator.device_name()"][0]
    )
    assert deepspeed_accelerator.DS_ACCELERATOR_ENV in ENVIRONMENT


def test_environment_variables_are_intels() -> None:
    ours = {
        runtime.LAZY_MODE_ENV,
        runtime.INT64_ENV,
        runtime.RECIPE_CACHE_ENV,
        autocast_lists.BF16_LIST_ENV,
        autocast_lists.FP32_LIST_ENV,
        deepspeed_accelerator.DS_ACCELERATOR_ENV,
    }
    assert ours <= set(ENVIRONMENT), ours - set(ENVIRONMENT)


def test_the_double_reads_lazy_mode_as_the_source(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import habana_frameworks.torch.core as core

    bridge_double.configure(lazy=None)
    monkeypatch.delenv(runtime.LAZY_MODE_ENV, raising=False)
    assert core.is_lazy()  # unset: lazy, as bridge 1.19
    monkeypatch.setenv(runtime.LAZY_MODE_ENV, "0")
    assert not core.is_lazy()
    assert "unset means lazy in 1.19" in ENVIRONMENT[runtime.LAZY_MODE_ENV][0]
    assert CONSTANTS["PT_HPU_LAZY_MODE flag default"].value == "1"


@pytest.mark.parametrize(("value", "mode"), [("0", "eager"), ("1", "lazy")])
def test_the_plugin_reads_lazy_mode_as_the_source(value: str, mode: str) -> None:
    """``PT_HPU_LAZY_MODE``: "0" is eager and "1" lazy for the plugin's settings as for the bridge."""
    assert ENVIRONMENT[runtime.LAZY_MODE_ENV].quotes == ('os.getenv("PT_HPU_LAZY_MODE", "1") != "0"',)
    assert runtime.Runtime.from_env({runtime.LAZY_MODE_ENV: value}).execution_mode == mode


def test_the_recipe_cache_defaults_and_fields_are_the_bridges() -> None:
    """The plugin's recipe cache defaults are the bridge's flag defaults, and the value it writes has no more
    fields than bridge 1.19 accepts (more fail the bridge's assertion)."""
    cache = runtime.RecipeCache("/tmp/recipes")
    assert (
        str(cache.delete_on_start).lower()
        == CONSTANTS["PT_CACHE_FOLDER_DELETE default (the recipe cache emptied at start)"].value
    )
    assert str(cache.max_size_mb) == CONSTANTS["PT_CACHE_FOLDER_SIZE_MB default (the recipe cache's size limit)"].value
    assert "1 to 3 comma-separated fields in 1.19" in ENVIRONMENT[runtime.RECIPE_CACHE_ENV].value
    assert 1 <= len(cache.env_value().split(",")) <= 3


def test_the_adapter_recognizes_the_bridges_out_of_memory_error(bridge_double: ModuleType) -> None:
    real = "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB"
    assert error_pattern("device out of memory").fullmatch(real)
    assert hpu.get_backend().is_out_of_memory(RuntimeError(real))


def _real_inc() -> ModuleType | None:
    """Intel Neural Compressor's ``quantization`` module when the real package is installed (not the double)."""
    if importlib.util.find_spec("neural_compressor") is None:  # a namespace package in neural-compressor-pt
        return None
    try:
        module = importlib.import_module("neural_compressor.torch.quantization")
    except Exception:  # an INC that cannot import here is as good as absent
        return None
    return None if "bridge_double" in str(module.__file__) else module


def _source_signature(module: ModuleType, function: str) -> str:
    """A function's parameters read from its source (INC wraps ``prepare``/``convert`` without ``functools.wraps``)."""
    path = inspect.getsourcefile(importlib.import_module(f"{module.__name__}.quantize"))
    assert path is not None
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for arg in (*node.args.args, *node.args.kwonlyargs):
                arg.annotation = None
            if node.args.kwarg is not None:
                node.args.kwarg.annotation = None
            return f"({ast.unparse(node.args)})"
    raise AssertionError(f"{function} not found in {path}")


def test_the_fp8_inference_adapter_fits_the_real_inc() -> None:
    inc = _real_inc()
    if inc is None:
        pytest.skip("Intel Neural Compressor is not installed (pip install neural-compressor-pt==3.10)")
    for function in ("prepare", "convert", "finalize_calibration"):
        expected = SIGNATURES[f"neural_compressor.torch.quantization.{function}"][0]
        assert_same_signature(_source_signature(inc, function), expected)
    config_parameters = inspect.signature(inc.FP8Config).parameters.values()
    plain = ", ".join(
        f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name if p.default is p.empty else f"{p.name}={p.default!r}"
        for p in config_parameters
    )
    assert_same_signature(f"({plain})", SIGNATURES["neural_compressor.torch.quantization.FP8Config"][0])
    # the settings lightning_gaudi.fp8.inference.prepare_fp8_inference passes, in both modes
    for mode in ("MEASURE", "QUANTIZE"):
        blocklist = {"names": ["head"], "types": []}
        config = inc.FP8Config(mode=mode, dump_stats_path="/tmp/lg/measure", fp8_config="E4M3", blocklist=blocklist)
        assert (config.measure, config.quantize) == (mode == "MEASURE", mode == "QUANTIZE")


def test_the_emulated_hccl_group_keeps_the_tables_rules() -> None:
    """lightning_gaudi.hpu.hccl (the emulator's and the double's "hccl" group) against the constants and errors rows."""
    from lightning_gaudi.hpu import hccl

    assert set(hccl.HCCL_REDUCE_OPS) == set(hccl_reduce_ops())
    assert frozenset(hccl_dtypes()) == hccl.HCCL_DTYPES
    assert error_text("HCCL reduce op not supported") == hccl.UNSUPPORTED_REDUCE_OP_MESSAGE
    assert error_text("HCCL AVG on bool") == hccl.BOOL_AVG_MESSAGE
    assert error_pattern("HCCL dtype not supported").fullmatch(hccl.UNSUPPORTED_DTYPE_MESSAGE + "Short")
