"""The benchmark suite runs end to end (``--quick``) and writes what ``benchmarks/README.md`` documents.

No timing is asserted here: performance targets live in ``benchmarks/README.md`` and are checked by a full run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import ddp_knobs, gaudi, report, run  # noqa: E402

SUMMARY_KEYS = {"median", "min", "max", "spread", "values"}


def _summary(value: Any) -> None:
    assert set(value) == SUMMARY_KEYS, value
    assert value["values"], value
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in value["values"]), value
    assert value["min"] <= value["median"] <= value["max"]


def _check_schema(results: dict[str, Any]) -> None:
    assert results["schema"] == run.SCHEMA_VERSION
    assert results["quick"] is True
    assert set(results["sections"]) == set(run.SECTIONS)
    machine = results["machine"]
    for key in ("cores", "cpu", "torch", "lightning", "python", "torch_threads", "load_average_1min"):
        assert key in machine, key
    assert machine["torch_threads"] == 1

    overhead = results["sections"]["overhead"]
    variants = {"hand", "stock", "stock_again", "stock_bar20", "plugin", "plugin_gaudi_set"}
    assert set(overhead["steps_per_s"]) == set(overhead["steps_per_cpu_s"]) == variants
    assert set(overhead["ratios"]) == set(overhead["ratios_wall"]) == set(overhead["ratios_best"])
    assert {"plugin/stock", "plugin/stock_bar20", "plugin/hand"} <= set(overhead["ratios"])
    for group in ("steps_per_s", "steps_per_cpu_s", "ratios", "ratios_wall"):
        for summary in overhead[group].values():
            _summary(summary)
    assert isinstance(overhead["met"], bool)
    assert 0 < overhead["plugin_code"]["plugin_share"] < 1  # the profile saw the plugin's code run
    assert "mark_step" in overhead["gaudi_set"]

    lazy = results["sections"]["lazy"]
    assert set(lazy["variants"]) == {"stock", "plugin", "plugin_gaudi_set"}
    for variant in lazy["variants"].values():
        _summary(variant["steps_per_s"])
        assert isinstance(variant["compilations_after_warmup"], int)
        assert variant["mark_steps_per_step"] > 0  # lazy mode really cut graphs
    # the stock loop reads its progress-bar value every step: a counter that cannot see that is broken
    assert lazy["variants"]["stock"]["host_syncs_per_step"] >= 1.0

    ddp = results["sections"]["ddp"]
    runs = ddp["bucket_cap"]["runs"]
    assert [r["bucket_cap_mb"] for r in runs] == list(ddp_knobs.CAPS)
    assert all(r["allreduce_calls_per_step"] >= 1 for r in runs)  # the comm hook saw every bucket
    memory = ddp["gradient_as_bucket_view"]
    assert set(memory["settings"]) == {name for name, _ in ddp_knobs.MEMORY_SETTINGS}
    assert memory["gradient_bytes"] > 0
    for key in ("steps_per_s_off", "steps_per_s_on", "on/off"):
        _summary(ddp["static_graph"][key])

    fused = results["sections"]["fused"]
    _summary(fused["ms_per_step"]["fused"])
    _summary(fused["ms_per_step"]["unfused"])
    assert fused["fused_optimizer"].endswith("AdamW")

    scaling = results["sections"]["scaling"]
    _summary(scaling["samples_per_s"]["1"])
    _summary(scaling["samples_per_s"]["2"])
    assert scaling["efficiency"] > 0

    if "threads" in run.SECTIONS:  # benchmarks/threads.py, once run.py runs it as a section
        threads = results["sections"]["threads"]
        assert threads["threads"][0] == 1
        for row in threads["per_threads"].values():
            _summary(row["steps_per_s"])


@pytest.mark.subprocess
def test_quick_suite_writes_results_table_and_figure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_GAUDI_")}
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]

    results = json.loads((tmp_path / "results.json").read_text())
    _check_schema(results)
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| measurement |")
    assert "overhead: plugin / stock Lightning" in table
    assert table.strip() in proc.stdout
    pytest.importorskip("matplotlib")
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("sizes", "cap", "expected"),
    [
        ([100] * 10, 250 / 2**20, 4),  # reversed, closes at >= 250 bytes: 300, 300, 300, 100
        ([2**20] * 3, 2.0, 2),  # 2 MiB then 1 MiB
        ([2**20, 3 * 2**20], 1.0, 2),  # a gradient larger than the cap gets its own bucket
        ([512 * 1024] * 4, None, 2),  # torch's default: a first bucket of 1 MiB, then 25 MB
    ],
)
def test_expected_bucket_count(sizes: list[int], cap: float | None, expected: int) -> None:
    assert ddp_knobs.expected_buckets(sizes, cap) == expected


def test_gaudi_script_refuses_emulation(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LIGHTNING_GAUDI_EMULATE", "eager")
    assert gaudi.main([]) == 2
    assert "unset LIGHTNING_GAUDI_EMULATE" in capsys.readouterr().err


def test_gaudi_script_refuses_without_bridge(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_gaudi import hpu

    monkeypatch.delenv("LIGHTNING_GAUDI_EMULATE", raising=False)
    monkeypatch.setattr(hpu, "bridge_installed", lambda: False)
    assert gaudi.main([]) == 2
    assert "habana_frameworks" in capsys.readouterr().err


@pytest.mark.parametrize(("only", "message"), [("overhead,nope", "unknown section"), ("scaling", "add ddp")])
def test_run_rejects_bad_sections(only: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--only", only])
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- the report (table and figure) of a run


def _published_results() -> dict[str, Any]:
    """The committed full run (benchmarks/results/results.json), the report's real input."""
    return json.loads((ROOT / "benchmarks" / "results" / "results.json").read_text())


def test_quick_run_judges_no_target() -> None:
    """A --quick run's numbers mean nothing: a failed-looking target there is noise, not news."""
    results = _published_results()
    saving = results["sections"]["ddp"]["gradient_as_bucket_view"]
    saving["saving_fraction_of_one_gradient_copy"]["in_use_after_backward_bytes"] = -4.839
    saving["met"] = False
    full = report.table(results)
    assert (
        "| ddp: gradient_as_bucket_view saving, fraction of one gradient copy (in use after backward) | -4.839 |"
        in full
    )
    assert "| >= 0.9 | **no** |" in full
    results["quick"] = True
    quick = report.table(results)
    assert "**no**" not in quick
    assert "| yes |" not in quick
    assert f"| >= 0.9 | {report.NOT_JUDGED} |" in quick
    assert "no target is judged" in quick


def test_figure_title_bars_and_legends() -> None:
    pytest.importorskip("matplotlib")
    figure = report.draw(_published_results())
    title = figure._suptitle.get_text()
    assert "((" not in title
    assert "))" not in title
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    lazy = next(ax for ax in figure.axes if ax.get_title() == "Lazy: host syncs per step")
    labels = {tick.get_text(): text.get_text() for tick, text in zip(lazy.get_xticklabels(), lazy.texts, strict=True)}
    assert labels == {"stock": "2.02", "plugin": "0.05", "plugin_gaudi_set": "0.05"}  # 0.05 bars are too small to see
    for ax in figure.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for patch in ax.patches:
            assert not box.overlaps(patch.get_window_extent(renderer)), f"the legend of {ax.get_title()!r} hides a bar"
        for text in ax.texts:
            assert not box.overlaps(text.get_window_extent(renderer)), f"the legend of {ax.get_title()!r} hides a label"


@contextlib.contextmanager
def _process_settings_restored() -> Iterator[None]:
    """The benchmarks quiet these libraries and take one torch thread, meant for a process of their own."""
    names = ("lightning.pytorch", "lightning.fabric", "torch._dynamo", "torch._inductor")
    loggers = [logging.getLogger(name) for name in names]
    levels, threads = [logger.level for logger in loggers], torch.get_num_threads()
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        torch.set_num_threads(threads)


def test_threads_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m benchmarks.threads --quick` (in this process; the quick suite runs both thread counts): the example
    GPT timed, a table and a JSON."""
    from benchmarks import threads

    out = tmp_path / "threads.json"
    before = torch.get_num_threads()
    with _process_settings_restored():
        assert threads.main(["--quick", "--threads", "1", "--out", str(out)]) in (None, 0)
        assert torch.get_num_threads() == before
    assert capsys.readouterr().out.startswith("| torch threads | steps/s |")
    result = json.loads(out.read_text())
    measured = result["threads"]
    assert measured["threads"] == [1]
    assert (measured["model"]["n_layer"], measured["batch_size"], measured["seq_len"]) == (4, 32, 128)  # the README job
    _summary(measured["per_threads"]["1"]["steps_per_s"])
    assert result["machine"]["usable_cores"] >= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--threads", "1,two"], "comma-separated whole numbers"), (["--threads", "0"], "at least 1")],
)
def test_threads_benchmark_rejects_bad_counts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import threads

    with pytest.raises(SystemExit):
        threads.main(argv)
    assert message in capsys.readouterr().err


def test_hf_models_benchmark_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m benchmarks.hf_models --quick` in this process, for the tables that need no fresh processes (the
    2-process and cold/warm compile tables start them; the full run covers those), and one compile worker."""
    from benchmarks import hf_models

    with _process_settings_restored():
        hf_models.main(["--quick", "--only", "overhead,lazy", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "hf_models.json").read_text())
    assert results["machine"]["torch_threads"] == 1
    for name in ("gpt2", "llama"):
        speed = results["overhead"]["models"][name]
        assert set(speed["vs_stock"]) == {"stock_again", "plugin"}  # the A/A control beside the plugin
        for summary in (*speed["steps_per_cpu_s"].values(), *speed["vs_stock"].values()):
            _summary(summary)
    lazy = results["lazy"]["models"]["llama"]
    assert lazy["counts"]["stock"]["host_syncs_per_step"] >= 1.0  # the stock loop reads the bar's loss every step
    assert lazy["counts"]["plugin"]["compilations_after_warmup"] == 0
    markdown = (tmp_path / "hf_models.md").read_text()
    assert markdown.strip() in capsys.readouterr().out
    assert "Machine: " in markdown
    assert markdown.count("| model | variant |") == 2

    monkeypatch.setenv("LIGHTNING_GAUDI_EMULATE", "eager")
    monkeypatch.setenv(hf_models.COMPILE_BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        with _process_settings_restored():
            hf_models.compile_worker("regional", "gpt2", 3, tmp_path / "compile.json")
    finally:
        torch._dynamo.reset()
    assert json.loads((tmp_path / "compile.json").read_text())["block_graphs"] == 1  # both GPT-2 blocks, one graph


def test_features_kernels_route_through_the_seam(eager_hpu: Any) -> None:
    """`benchmarks.features`' kernels measurement, in this process with tiny steps: FusedKernels sends the LLaMA's
    attention, RMSNorm and RoPE to the seam (the plain fit never calls it), and the losses do not move."""
    from benchmarks import features

    settings = features.Settings(kernels_steps=2, kernels_warmup=0, kernels_repetitions=1)
    with _process_settings_restored():
        result = features.kernels(settings)
    calls = result["seam_calls_per_step"]
    assert calls["plain"] == dict.fromkeys(features.SEAM_KERNELS, 0)
    assert calls["fused"] == {"sdpa": 2, "rms_norm": 5, "rope": 4}  # 2 layers: attention, 2 norms + final, q and k
    assert result["loss_max_abs_diff"] < features.TOLERANCE
    assert not any(name in vars(eager_hpu) for name in features.SEAM_KERNELS)  # the counting wrappers are gone
