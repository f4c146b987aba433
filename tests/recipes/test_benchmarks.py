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

from benchmarks import gaudi, run  # noqa: E402

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

    ddp = results["sections"]["ddp"]
    assert set(ddp["steps_per_second"]) == {"stock", "plugin"}  # the full run's other two: the same code paths
    for summary in (*ddp["steps_per_second"].values(), *ddp["vs_stock"].values()):
        _summary(summary)


@pytest.mark.subprocess
def test_quick_suite_writes_results_and_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_GAUDI_")}
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]

    results = json.loads((tmp_path / "results.json").read_text())
    _check_schema(results)
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| measurement |")
    assert "overhead: plugin / stock Lightning" in table
    assert "ddp (2 processes): plugin / stock Lightning DDP" in table
    assert table.strip() in proc.stdout
    assert (tmp_path / "ddp_overhead.md").read_text().startswith("2 processes, tiny MLP")


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


@pytest.mark.parametrize(("only", "message"), [("overhead,nope", "unknown section"), ("lazy", "unknown section")])
def test_run_rejects_bad_sections(only: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--only", only])
    assert message in capsys.readouterr().err


def _overhead_results(quick: bool) -> dict[str, Any]:
    one = {"median": 0.9, "min": 0.8, "max": 1.0, "spread": 0.2, "values": [0.8, 0.9, 1.0]}
    overhead = {
        "steps_per_s": {"stock": one, "plugin": one},
        "steps_per_cpu_s": {"stock": one, "plugin": one},
        "ratios": {"plugin/stock": one},
        "ratios_wall": {"plugin/stock": one},
        "met": False,
        "plugin_code": {"plugin_share": 0.01, "plugin_seconds": 0.01, "steps": 100},
    }
    machine = {"cores": 2, "cpu": "x", "torch": "t", "lightning": "l", "python": "p", "torch_threads": 1}
    return {
        "quick": quick,
        "mode": "emulated (eager)",
        "duration_s": 1.0,
        "started_utc": "now",
        "machine": {**machine, "load_average_1min": 0.5},
        "sections": {"overhead": overhead},
    }


def test_quick_run_judges_no_target() -> None:
    """A --quick run's numbers mean nothing: a failed-looking target there is noise, not news."""
    full = run.table(_overhead_results(quick=False))
    assert "| >= 0.99 (CPU-time median) | **no** |" in full
    quick = run.table(_overhead_results(quick=True))
    assert "**no**" not in quick
    assert f"| >= 0.99 (CPU-time median) | {run.NOT_JUDGED} |" in quick
    assert "no target is judged" in quick


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
