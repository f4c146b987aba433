"""The bridge double, the adapter and (where installed) Intel's packages held to docs/conformance.md, the table of
names, signatures and structures read from Intel's sources."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.hpu import autocast_lists, deepspeed_accelerator, runtime
from lightning_gaudi.hpu.backend import MEMORY_STAT_KEYS

TABLE = Path(__file__).parents[2] / "docs" / "conformance.md"


def read_table(section: str) -> dict[str, tuple[str, str]]:
    """The rows after ``<!-- conformance:<section> -->``: name -> (value, source)."""
    lines = TABLE.read_text().splitlines()
    start = lines.index(f"<!-- conformance:{section} -->") + 3  # the marker, the header, the rule
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) >= 3, line
        rows[cells[0]] = (cells[1], cells[-1])
    return rows


SIGNATURES = read_table("signatures")
STRUCTURES = read_table("structures")
ENVIRONMENT = read_table("environment")
SOURCES = read_table("sources")


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


def test_every_row_names_a_known_source() -> None:
    assert set(SOURCES) == {"B", "D", "I"}
    for section in (SIGNATURES, STRUCTURES, ENVIRONMENT):
        for name, (_, source) in section.items():
            assert source.split(":")[0] in SOURCES, f"{name}: {source}"
    for key in ("B", "D"):
        assert re.fullmatch(r"[0-9a-f]{40}", SOURCES[key][1]), SOURCES[key]


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
    return tuple(part.strip() for part in STRUCTURES[row][0].split(","))


def test_memory_stats_keys_are_intels(bridge_double: ModuleType, eager_hpu: hpu.Backend) -> None:
    keys = _listed("habana_frameworks.torch.hpu.memory_stats() keys")
    assert keys == MEMORY_STAT_KEYS
    assert tuple(bridge_double.MEMORY_STAT_KEYS) == keys
    assert tuple(eager_hpu.memory_stats()) == keys


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


def test_names_the_adapter_uses_are_intels(bridge_double: ModuleType) -> None:
    backend = hpu.get_backend()
    assert backend.collective_backend == STRUCTURES["hccl process-group backend name"][0]
    assert backend.compile_backend == STRUCTURES["torch.compile backend name"][0]
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
