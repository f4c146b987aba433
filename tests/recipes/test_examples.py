"""examples/train.py's training path on the emulated HPU: the main command's example learns, and every experiment
runs with fast_dev_run (multi-card experiments as real rank processes started by the app)."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gpt_recipe import logs, task
from gpt_recipe.data import StdlibTextDataModule, stdlib_source_files
from gpt_recipe.model import GPTLanguageModel
from helpers.configs import CONF_DIR, compose_train
from omegaconf import DictConfig

import lightning_gaudi.app.hydra as lg_hydra
from lightning_gaudi import hpu
from lightning_gaudi.app.hydra import ranks

ROOT = CONF_DIR.parent
EXPERIMENTS = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
#: Two steps of a narrow model: enough to run every callback of the default set once.
_TINY_FIT = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
    "data.max_bytes=20000",
    "data.seq_len=16",
    "data.batch_size=4",
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=2",
    "throughput_warmup_steps=0",
]


def test_main_command_example_learns(
    isolated_env: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The README's main command with fewer, smaller steps: emulation switched on by itself, the loss falls, and
    checkpoints, the CSV log and results.json land in the run folder."""
    isolated_env.setattr(hpu.runtime, "bridge_installed", lambda: False)
    cfg = compose_train(
        [
            "trainer.max_steps=30",
            "trainer.val_check_interval=30",
            "trainer.limit_val_batches=4",
            "trainer.log_every_n_steps=5",
            "data.batch_size=8",
            "data.seq_len=64",
            "data.max_bytes=200000",
            "model.n_layer=2",
            "model.n_embd=64",
            "model.warmup_steps=5",
            "throughput_warmup_steps=2",
        ],
        output_dir=tmp_path,
    )
    objective = lg_hydra.run(cfg, task.train)
    out = capsys.readouterr().out
    emulation = [r.getMessage() for r in caplog.records if "emulat" in r.getMessage().lower()]
    assert len(emulation) == 1  # one line says what runs
    assert "EMULATED on the CPU in eager mode" in emulation[0]
    assert "using: 1 HPU, strategy SingleHPUStrategy" in emulation[0]
    assert "EMULATED on the CPU" in out
    assert "throughput:" in out
    assert "peak memory" in out

    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    curve = results["loss_curve"]
    assert len(curve) >= 4
    assert curve[0][1] > 4.0  # close to ln(256) = 5.55 at the start
    assert curve[-1][1] < curve[0][1] - 1.0  # and clearly lower after 30 steps
    assert objective == pytest.approx(results["metrics"]["val/ppl"])
    assert math.exp(results["metrics"]["val/loss"]) == pytest.approx(results["metrics"]["val/ppl"], rel=1e-3)
    assert results["metrics"]["val/ppl"] < 60
    assert results["global_step"] == 30
    assert results["samples_per_sec"] > 0
    assert results["tokens_per_sec"] == pytest.approx(results["samples_per_sec"] * 64)
    assert results["peak_memory_gib"] > 0
    assert (results["backend"], results["emulated"], results["strategy"]) == ("eager", True, "SingleHPUStrategy")
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len({row["step"] for row in rows}) == len(rows), "one row per logged step"
    assert any(row["train/loss"] and row["lr-AdamW/pg1"] and row[f"{MEMORY}InUse (GiB)"] for row in rows), rows[0]


MEMORY = "MemoryStats.on_train_batch_end/hpu/"


def _needs_deepspeed(name: str) -> list[pytest.MarkDecorator]:
    """Experiments on the ``deepspeed`` extra are skipped without it (scripts/setup.sh installs it for CI)."""
    if name != "gpt_zero":
        return []
    return [pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")]


def _experiment_overrides(name: str) -> list[str]:
    overrides = [
        f"experiment={name}",
        "debug=fast_dev_run",
        "data.max_bytes=20000",
        "data.seq_len=16",
        "data.batch_size=4",
        "data.num_workers=0",
    ]
    if name == "gpt_gaudi":
        # 2 emulated cards instead of 8 and a narrower model (the test machine has 2 cores, and bf16 is slow on CPUs)
        overrides += ["trainer.devices=2", "model.n_layer=2", "model.n_embd=48"]
    return overrides


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.subprocess, *_needs_deepspeed(n)])
        if n in ("gpt_fsdp", "gpt_gaudi", "gpt_tp", "gpt_zero")
        else n
        for n in EXPERIMENTS
        if n != "gpt_ddp"  # the two-card profiler run trains it (12 steps: the profiler's schedule)
    ],
)
def test_experiment_fast_dev_run(name: str, isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(_experiment_overrides(name), output_dir=tmp_path)
    lg_hydra.run(cfg, task.train)
    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    assert results["global_step"] == 1
    _assert_experiment_ran(cfg, results, tmp_path)


def _assert_experiment_ran(cfg: DictConfig, results: dict[str, Any], folder: Path) -> None:
    parallel = cfg.strategy._target_ in (
        "lightning_gaudi.HPUParallelStrategy",
        "lightning_gaudi.HPUFSDPStrategy",
        "lightning_gaudi.HPUDeepSpeedStrategy",
        "lightning_gaudi.HPUModelParallelStrategy",
    )
    assert results["world_size"] == (cfg.trainer.devices if parallel else 1)
    assert results["backend"] == (cfg.runtime.execution_mode or "eager")
    assert math.isfinite(results["metrics"]["val/loss"])
    if results["world_size"] > 1:
        assert (folder / ranks.RANK_CONFIG_FILE).is_file()
        assert results["ddp_kwargs"].get("bucket_cap_mb") == cfg.strategy.get("bucket_cap_mb")


@pytest.mark.subprocess
def test_rank_failure_is_reported(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A rank that fails stops the job with an error naming the exit codes (here: an impossible model)."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(
        ["strategy=hpu_parallel", "trainer.devices=2", "debug=fast_dev_run", "model.n_head=3"], output_dir=tmp_path
    )
    # both ranks fail; whichever fails second may already have been stopped by the launcher (-15)
    with pytest.raises(RuntimeError, match=r"Rank process\(es\) failed with exit codes \[(1, (1|-15)|-15, 1)\]"):
        lg_hydra.run(cfg, task.train)
    assert not (tmp_path / task.RESULTS_FILE).exists()


#: `python examples/train.py profiler=hpu trainer.max_steps=12` in small: the recipe's schedule (3 steps waited out,
#: 1 warm-up, 5 recorded), the sanity check's validation batch, no validation inside the fit.
_PROFILED_FIT = [
    "profiler=hpu",
    *_TINY_FIT,
    "trainer.max_steps=12",
    "trainer.val_check_interval=50",
    "callbacks=none",
    "logger=none",
]


def test_profiler_hpu_traces_the_fit_into_the_run_folder_and_reports(
    isolated_env: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`profiler=hpu`: the task hands the profiler to the Trainer, a trace with the training step lands in the run
    folder, the report is printed, and results.json keeps it."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(_PROFILED_FIT, output_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        lg_hydra.run(cfg, task.train)
    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    profile = results["profile"]
    assert profile["steps"] == 5, "3 steps waited out, 1 warm-up, 5 recorded"
    assert profile["step_ms"] > 0
    assert 0 < profile["model_share"] < 1
    assert profile["top_operators"]
    assert profile["trace_dir"] == str(tmp_path / "profiler")
    [trace] = list((tmp_path / "profiler").glob("*.pt.trace.json"))
    names = {str(event.get("name")) for event in json.loads(trace.read_text())["traceEvents"]}
    assert any("training_step" in name for name in names)
    reports = [r.getMessage() for r in caplog.records if "HPUProfiler: 5 profiled training steps" in r.getMessage()]
    assert len(reports) == 1
    assert "top operators by self time: aten::" in reports[0]
    out = capsys.readouterr().out
    assert f"profile: 5 steps, {profile['step_ms']:.2f} ms each" in out
    assert f"traces in {tmp_path / 'profiler'}" in out


@pytest.mark.subprocess
def test_profiler_hpu_on_two_cards_writes_one_trace_per_rank(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The rank processes the app starts build the profiler from the job's resolved config: both trace into the run
    folder, and rank zero's report reaches results.json. The job is the gpt_ddp experiment's (its own checks too)."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    overrides = ["experiment=gpt_ddp", "data.num_workers=0", *_PROFILED_FIT, "trainer.val_check_interval=12"]
    cfg = compose_train(overrides, output_dir=tmp_path)
    lg_hydra.run(cfg, task.train)
    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    assert results["global_step"] == 12
    assert results["world_size"] == 2
    _assert_experiment_ran(cfg, results, tmp_path)
    assert results["profile"]["steps"] == 5
    traces = sorted(path.name for path in (tmp_path / "profiler").glob("*.pt.trace.json"))
    assert [name.split("-")[1] for name in traces] == ["0", "1"]  # fit-<local rank>-<step function>.<id>.pt.trace.json


def test_profiler_hpu_reports_the_training_steps_when_validation_follows(
    isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The example's own shape, validation every N steps (every 100 of 300 by default): the report must still be about
    the 5 recorded training steps."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    overrides = [*_PROFILED_FIT, "trainer.val_check_interval=12", "trainer.limit_val_batches=2"]
    lg_hydra.run(compose_train(overrides, output_dir=tmp_path), task.train)
    profile = json.loads((tmp_path / task.RESULTS_FILE).read_text())["profile"]
    assert profile["steps"] == 5
    assert profile["model_share"] > 0


def test_profiler_in_two_places_is_an_error(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(["profiler=hpu", "+trainer.profiler=simple", *_TINY_FIT], output_dir=tmp_path)
    with pytest.raises(ValueError, match=r"trainer.profiler='simple' and the profiler group .*HPUProfiler"):
        task.train(cfg)
    assert not list(tmp_path.iterdir())


def test_lightnings_own_profiler_by_name_still_works(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the profiler group, `+trainer.profiler=simple` reaches the Trainer (the task passes no profiler)."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(["+trainer.profiler=simple", *_TINY_FIT, "callbacks=none", "logger=none"], output_dir=tmp_path)
    lg_hydra.run(cfg, task.train)
    assert "profile" not in json.loads((tmp_path / task.RESULTS_FILE).read_text())


# ---------------------------------------------------------------- the example's data and model


def test_stdlib_data_is_deterministic_split_by_file_and_static(tmp_path: Path) -> None:
    first = StdlibTextDataModule(seq_len=32, batch_size=8, max_bytes=200_000)
    second = StdlibTextDataModule(seq_len=32, batch_size=8, max_bytes=200_000)
    first.setup("fit")
    second.setup("fit")
    assert first.train_set is not None
    assert second.train_set is not None
    assert first.val_set is not None
    assert torch.equal(first.train_set.data, second.train_set.data)
    assert torch.equal(first.val_set.data, second.val_set.data)
    assert first.train_set.data.numel() == 200_000
    assert not _shares_a_line(first.train_set.data, first.val_set.data)
    x, y = first.train_set[3]
    assert x.shape == y.shape == (32,)
    assert torch.equal(x[1:], y[:-1])
    batches = list(first.train_dataloader())
    assert all(b[0].shape == (8, 32) for b in batches)  # drop_last: no ragged batch
    assert len(batches) == len(first.train_set) // 8
    assert [b[0][0, :4].tolist() for b in batches[:2]] == [
        b[0][0, :4].tolist() for b in list(second.train_dataloader())[:2]
    ]


def _shares_a_line(train: torch.Tensor, val: torch.Tensor) -> bool:
    train_lines = set(bytes(train.tolist()).split(b"\n"))
    long_val_lines = [line for line in bytes(val.tolist()).split(b"\n") if len(line) > 60]
    shared = [line for line in long_val_lines if line in train_lines]
    return len(shared) > len(long_val_lines) // 2


def test_stdlib_data_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No Python source files"):
        stdlib_source_files(tmp_path)
    with pytest.raises(ValueError, match="val_fraction"):
        StdlibTextDataModule(val_fraction=1.5)
    small = StdlibTextDataModule(seq_len=16, batch_size=4096, max_bytes=5000)
    small.setup("fit")
    with pytest.raises(ValueError, match="cannot fill one batch"):
        small.train_dataloader()


def test_gpt_attention_goes_through_the_seam(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = type(eager_hpu).sdpa

    def counting_sdpa(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("is_causal"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(eager_hpu), "sdpa", counting_sdpa)
    model = GPTLanguageModel(block_size=8, n_layer=2, n_head=2, n_embd=16)
    logits = model(torch.randint(0, 256, (3, 8)))
    assert logits.shape == (3, 8, 256)
    assert calls == [True, True]


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = GPTLanguageModel(block_size=8, n_layer=1, n_head=2, n_embd=16).eval()
    tokens = torch.randint(0, 256, (1, 8))
    changed = tokens.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(tokens)[0, :5], model(changed)[0, :5], atol=1e-6)
        assert not torch.allclose(model(tokens)[0, 5:], model(changed)[0, 5:])


# ---------------------------------------------------------------- a first run as the README has it


def test_logger_none_runs_without_the_learning_rate_monitor(
    isolated_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`logger=none` is a documented option; the default callbacks' LearningRateMonitor needs a logger, so the task
    leaves it out and says so once, instead of Lightning stopping the run."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(["logger=none", *_TINY_FIT], output_dir=tmp_path)
    assert "lr_monitor" in cfg.callbacks
    with caplog.at_level(logging.INFO):
        lg_hydra.run(cfg, task.train)
    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    assert results["global_step"] == 2
    assert not (tmp_path / "csv").exists()
    notices = [r.getMessage() for r in caplog.records if "LearningRateMonitor" in r.getMessage()]
    assert len(notices) == 1
    assert "logger=none" in notices[0]


@pytest.mark.subprocess
def test_first_screen_and_run_log(tmp_path: Path) -> None:
    """`python examples/train.py` as a newcomer runs it (no settings): one line says what runs, no upstream notices
    nobody asked for, and the run folder's train.log holds Lightning's and lightning_gaudi's lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "OMP_", "MKL_"))}
    env["LIGHTNING_GAUDI_LOG_DIR"] = str(tmp_path / "logs")
    command = [sys.executable, str(ROOT / "examples" / "train.py"), *_TINY_FIT, "trainer.max_steps=3"]
    done = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp_path
    )
    output = done.stdout
    assert done.returncode == 0, output[-4000:]
    screen = output.split("=== lightning_gaudi run summary ===")[0]
    if not hpu.bridge_installed():
        emulation = [line for line in screen.splitlines() if "emulat" in line.lower()]
        assert len(emulation) == 1, emulation
        assert emulation[0].startswith(
            "HPU available: True (GAUDI2, EMULATED on the CPU in eager mode, 1 torch thread)"
        )
        assert "using: 1 HPU, strategy SingleHPUStrategy." in emulation[0]
    assert "LeafSpec" not in output
    assert "Tip:" not in output
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    run_log = (run / "train.log").read_text()
    assert "[lightning.pytorch.utilities.rank_zero][INFO] - HPU available: True" in run_log
    assert "`Trainer.fit` stopped: `max_steps=3` reached." in run_log
    assert "[lightning.pytorch.utilities.rank_zero][INFO] - Throughput over" in run_log  # lightning_gaudi's callback


# examples/cli.py's console is as quiet: tests/test_cli.py::test_fit_with_the_example_cli checks its fit's output


@pytest.fixture
def library_loggers() -> Iterator[None]:
    """Lightning's and lightning_gaudi's loggers, the root logger and the warning filters restored afterwards."""
    loggers = [logging.getLogger(name) for name in (*logs.LIBRARY_LOGGERS, logs.LIGHTNING_NOTICES, "")]
    saved = [(logger, list(logger.handlers), list(logger.filters), logger.propagate) for logger in loggers]
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, logging.FileHandler)]  # pytest's own log file
    with warnings.catch_warnings():
        yield
    for logger, handlers, filters, propagate in saved:
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:], logger.filters[:], logger.propagate = handlers, filters, propagate


def test_library_lines_reach_hydras_log_file(
    library_loggers: None, isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hydra_file = logging.FileHandler(tmp_path / "train.log")
    hydra_file.setFormatter(logging.Formatter(logs.LOG_FORMAT))
    logging.getLogger().addHandler(hydra_file)
    for name in logs.LIBRARY_LOGGERS:  # as when the library is imported before Hydra configures logging
        logging.getLogger(name).propagate = False
    logs.setup()
    logs.setup()  # idempotent: each line once
    logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
    logging.getLogger("lightning_gaudi.callbacks.diagnostics").warning("3 graph compilations after warm-up")
    logging.getLogger(logs.LIGHTNING_NOTICES).info("💡 Tip: For seamless cloud logging, install something")
    hydra_file.flush()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert [line.split(" - ", 1)[1] for line in lines] == [
        "GPU available: False, used: False",
        "3 graph compilations after warm-up",
    ]
    assert os.environ[logs.LOG_FILE_ENV] == str(tmp_path / "train.log")


def test_rank_processes_started_by_the_app_log_beside_the_run_log(
    library_loggers: None, isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolated_env.setenv(logs.LOG_FILE_ENV, str(tmp_path / "train.log"))
    isolated_env.setenv("LOCAL_RANK", "1")
    isolated_env.setenv("NODE_RANK", "0")
    isolated_env.setenv("WORLD_SIZE", "2")
    logging.getLogger("lightning_gaudi").propagate = False
    logs.setup()
    rank_log = tmp_path / "train_rank0.1.log"  # node 0, local rank 1: the label of lightning_gaudi's resolvers
    assert not rank_log.exists()  # nothing logged yet, no empty file
    logging.getLogger("lightning_gaudi.distributed").warning("peer 0 is late")
    for handler in logging.getLogger("lightning_gaudi").handlers:
        handler.flush()
    assert rank_log.read_text().endswith("[WARNING] - peer 0 is late\n")


def test_upstream_noise_is_left_off_the_console(library_loggers: None) -> None:
    logs.quiet_upstream_noise()
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another FutureWarning"]


def test_a_restarted_job_resumes_from_its_own_checkpoint(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What torchrun or a SLURM requeue does: the same command in the same run folder continues (``ckpt_path: auto``);
    the example's hyperparameters must load under Lightning's ``weights_only`` checkpoint loading."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    tiny = [
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=1",
        "data.max_bytes=20000",
        "data.seq_len=16",
        "data.batch_size=4",
        "model.n_layer=1",
        "model.n_embd=16",
        "model.n_head=2",
        "throughput_warmup_steps=0",
        "logger=none",
    ]
    lg_hydra.run(compose_train([*tiny, "trainer.max_steps=3"], output_dir=tmp_path), task.train)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    lg_hydra.run(compose_train([*tiny, "trainer.max_steps=5"], output_dir=tmp_path), task.train)
    results = json.loads((tmp_path / task.RESULTS_FILE).read_text())
    assert results["global_step"] == 5
    assert results["timed_steps"] == 2, "only the two new steps ran"
