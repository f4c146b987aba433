"""Sweeps: a real Hydra multirun of 2 points x 2-process DDP (one job, one process group and one result per point),
a real Optuna search, torchrun ranks sharing one run folder, and the sweep report's table, best trial and plot."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from helpers.shared_job import run_once

from lightning_gaudi import hpu

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"
REPORT = ROOT / "scripts" / "sweep_report.py"
#: A tiny, quick configuration of the example.
TINY = [
    "trainer.max_steps=4",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=1",
    "data.max_bytes=40000",
    "data.seq_len=16",
    "data.batch_size=4",
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=2",
    "throughput_warmup_steps=1",
    "callbacks=none",
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "SLURM_", "TORCHELASTIC_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "MASTER_ADDR", "GROUP_RANK"):
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    env["HYDRA_FULL_ERROR"] = "1"
    return env


def _load_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sweep_report", REPORT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ddp_sweep(folder: Path) -> None:
    sweep_dir = folder / "multirun"
    folder.mkdir()
    command = [
        sys.executable,
        str(TRAIN),
        "-m",
        "strategy=hpu_parallel",
        "trainer.devices=2",
        "strategy.bucket_cap_mb=1,8",
        *TINY,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, cwd=folder)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    (folder / "output.txt").write_text(output)


@pytest.fixture(scope="module")
def ddp_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Runs `examples/train.py -m strategy=hpu_parallel trainer.devices=2 strategy.bucket_cap_mb=1,8` once: the
    sweep's folder and what it printed."""
    folder = run_once(tmp_path_factory, "ddp-sweep", _ddp_sweep)
    return folder / "multirun", (folder / "output.txt").read_text()


@pytest.mark.subprocess
def test_multirun_ddp_gives_one_job_and_one_process_group_per_point(ddp_sweep: tuple[Path, str]) -> None:
    sweep_dir, output = ddp_sweep
    assert output.count("Launching 2 jobs locally") == 1  # the ranks did not re-run the sweep
    assert output.count("starting 2 rank process(es)") == 2
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in jobs] == ["0", "1"]
    seen = {}
    for job in jobs:
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        bucket = float(next(o for o in overrides if o.startswith("strategy.bucket_cap_mb=")).split("=")[1])
        results = json.loads((job / "results.json").read_text())
        assert results["world_size"] == 2
        assert results["devices"] == 2
        assert results["strategy"] == "HPUParallelStrategy"
        assert results["ddp_kwargs"]["bucket_cap_mb"] == bucket  # each group got its own point's setting
        assert results["global_step"] == 4
        assert results["output_dir"] == str(job)
        assert results["samples_per_sec"] > 0
        assert (job / "rank_config.yaml").is_file()
        seen[bucket] = job.name
    assert set(seen) == {1.0, 8.0}
    # what the ranks printed: no upstream notices nobody asked for, one line saying what runs per job
    assert "LeafSpec" not in output
    assert "Tip:" not in output
    assert output.count("using: 2 HPUs, strategy HPUParallelStrategy") == 2
    for job in jobs:  # rank zero's lines are in the job's log, beside the sweep process's own
        assert "using: 2 HPUs, strategy HPUParallelStrategy" in (job / "train.log").read_text()
    # nothing else was created next to the jobs (no stray run folders from re-executed ranks)
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["0", "1", "multirun.yaml"]


@pytest.mark.subprocess
def test_sweep_report_table_and_plot(ddp_sweep: tuple[Path, str], tmp_path: Path) -> None:
    sweep_dir, _ = ddp_sweep
    done = subprocess.run(  # the parent folder: the report finds the newest sweep in it
        [sys.executable, str(REPORT), str(sweep_dir.parent), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| strategy.bucket_cap_mb |" in done.stdout
    assert f"reading the newest sweep, {sweep_dir}" in done.stderr
    rows = list(csv.DictReader((tmp_path / "sweep_report.csv").open()))
    assert [(float(r["strategy.bucket_cap_mb"]), r["status"]) for r in rows] == [(1.0, "done"), (8.0, "done")]
    assert all(float(r["samples_per_sec"]) > 0 and r["world_size"] == "2" for r in rows)
    png = (tmp_path / "sweep_report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 5000


def test_sweep_report_marks_unfinished_jobs_and_finds_the_swept_key(tmp_path: Path) -> None:
    report = _load_report()
    for number, (bucket, results) in enumerate([(4, {"samples_per_sec": 10.0, "world_size": 2}), (16, None)]):
        job = tmp_path / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(["strategy=hpu_parallel", f"strategy.bucket_cap_mb={bucket}"])
        )
        if results is not None:
            (job / "results.json").write_text(json.dumps(results))
    jobs = report.read_sweep(tmp_path)
    assert report.swept_params(jobs) == ["strategy.bucket_cap_mb"]
    rows = report.table_rows(jobs, ["strategy.bucket_cap_mb"])
    assert [(r["strategy.bucket_cap_mb"], r["status"], r["samples_per_sec"]) for r in rows] == [
        (4, "done", 10.0),
        (16, "no results", None),
    ]
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "sweep_report.png").is_file()


def _fabricated_sweep(root: Path, points: list[tuple[int, float]]) -> Path:
    """A sweep folder as Hydra and examples/train.py leave it, over ``strategy.bucket_cap_mb``."""
    for number, (bucket, samples_per_sec) in enumerate(points):
        job = root / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(["strategy=hpu_parallel", f"strategy.bucket_cap_mb={bucket}"])
        )
        (job / "results.json").write_text(json.dumps({"samples_per_sec": samples_per_sec, "world_size": 2}))
    (root / "multirun.yaml").write_text("{}\n")
    return root


def test_sweep_plot_shows_the_swept_values_and_starts_at_zero(tmp_path: Path) -> None:
    """The bucket sweep's points (1, 4, 16, 64 MB): ticks at the swept values, not at 10^0 and 10^1, and a y axis from
    0, so that 52 against 54 samples/s does not look like a doubling."""
    pytest.importorskip("matplotlib")
    report = _load_report()
    sweep = _fabricated_sweep(tmp_path / "sweep", [(1, 52.1), (4, 53.0), (16, 54.2), (64, 53.4)])
    jobs = report.read_sweep(sweep)
    figure = report.draw(
        report.table_rows(jobs, ["strategy.bucket_cap_mb"]), "strategy.bucket_cap_mb", "samples_per_sec"
    )
    (axes,) = figure.axes
    assert axes.get_xscale() == "log"
    assert list(axes.get_xticks()) == [1.0, 4.0, 16.0, 64.0]
    assert [label.get_text() for label in axes.get_xticklabels()] == ["1", "4", "16", "64"]
    assert len(axes.xaxis.get_minor_locator().tick_values(1, 64)) == 0  # no unlabelled 2, 3, ... 9 ticks
    assert axes.get_ylim()[0] == 0
    assert axes.get_ylim()[1] >= 54.2
    assert report.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "sweep_report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_report_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _load_report()
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "No sweep folder" in capsys.readouterr().err
    assert report.main([str(tmp_path)]) == 2
    assert "holds no job folders" in capsys.readouterr().err


@pytest.mark.subprocess
def test_torchrun_ranks_share_one_run_folder(tmp_path: Path) -> None:
    """Under torchrun every rank runs the Hydra app: one run folder, Hydra's files and results.json from rank 0."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(TRAIN),
        "strategy=hpu_parallel",
        "trainer.devices=2",
        *TINY,
        f"paths.log_dir={tmp_path}",
    ]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    runs = list((tmp_path / "train" / "runs").iterdir())
    assert len(runs) == 1
    assert runs[0].name.startswith("torchrun-")
    run = runs[0]
    assert (run / ".hydra" / "config.yaml").is_file()
    assert sorted(p.name for p in run.glob("*.log")) == ["train.log", "train_rank1.log"]
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2
    assert not (run / "rank_config.yaml").exists()  # torchrun started the ranks, not the app


# ---------------------------------------------------------------- Optuna searches (hparams_search=gpt_optuna)


def _fabricated_optuna_search(root: Path, trials: list[tuple[float, int, float | None]], best: int | None) -> Path:
    """An Optuna search folder as Hydra's Optuna sweeper and examples/train.py leave it: job folders, no
    multirun.yaml, and optimization_results.yaml naming trial ``best`` (none while the search runs)."""
    for number, (lr, batch_size, ppl) in enumerate(trials):
        job = root / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump([f"model.lr={lr!r}", f"data.batch_size={batch_size}", "hparams_search=gpt_optuna"])
        )
        (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"optimized_metric": "val/ppl", "seed": 1}))
        if ppl is not None:
            (job / "results.json").write_text(json.dumps({"metrics": {"val/ppl": ppl}, "world_size": 1}))
    if best is not None:
        lr, batch_size, ppl = trials[best]
        (root / "optimization_results.yaml").write_text(
            yaml.safe_dump(
                {"name": "optuna", "best_params": {"model.lr": lr, "data.batch_size": batch_size}, "best_value": ppl},
                sort_keys=False,
            )
        )
    return root


def test_sweep_report_names_the_best_trial_of_an_optuna_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _load_report()
    trials = [(3.0e-4, 16, 14.2), (2.1e-3, 16, 9.7), (8.4e-3, 16, 11.0)]
    older = _fabricated_optuna_search(tmp_path / "multiruns" / "a", [(1e-3, 8, 20.0)], best=0)
    search = _fabricated_optuna_search(tmp_path / "multiruns" / "b", trials, best=1)
    os.utime(older, (1, 1))
    assert report.main([str(tmp_path / "multiruns"), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert f"reading the newest sweep, {search}" in captured.err  # found without multirun.yaml
    # the search's parameters are columns even where every trial had the same value
    assert "| job | model.lr | data.batch_size | status |" in captured.out
    assert "best trial (optimization_results.yaml): job 1: model.lr=0.0021, data.batch_size=16 -> val/ppl 9.7" in (
        captured.out
    )
    rows = list(csv.DictReader((tmp_path / "out" / "sweep_report.csv").open()))
    assert [r["best"] for r in rows] == ["", "*", ""]
    assert [float(r["val/ppl"]) for r in rows] == [14.2, 9.7, 11.0]


def test_optuna_search_plot_is_the_objective_against_the_first_parameter(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = _load_report()
    trials = [(3.0e-4, 8, 14.2), (2.1e-3, 16, 9.7), (8.4e-3, 64, 11.0), (1.2e-4, 32, 18.5)]
    search = _fabricated_optuna_search(tmp_path / "search", trials, best=1)
    assert report.main([str(search)]) == 0
    assert (search / "sweep_report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    jobs = report.read_sweep(search)
    figure = report.draw(report.table_rows(jobs, ["model.lr"]), "model.lr", "val/ppl", scatter=True)
    (axes,) = figure.axes
    (points, *_) = axes.get_lines()
    assert points.get_linestyle() == "None"  # trials, not a curve: the other parameter differs between them
    assert axes.get_xscale() == "log"
    assert axes.get_ylabel() == "val/ppl"


def test_sweep_report_on_an_unfinished_optuna_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _load_report()
    search = _fabricated_optuna_search(tmp_path / "search", [(3.0e-4, 8, 14.2), (2.1e-3, 16, None)], best=None)
    (search / "0" / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"sweeper": {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.X"}}})
    )
    assert report.main([str(search), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "no optimization_results.yaml yet: the search has not finished" in out
    assert "| 1 | 0.0021 | 16 | no results |" in out


@pytest.mark.subprocess
def test_optuna_search_runs_trials_and_the_report_names_the_best(tmp_path: Path) -> None:
    """`examples/train.py hparams_search=gpt_optuna` for real with 2 tiny trials: Optuna picks each trial's learning
    rate and batch size, each trial trains and validates, the sweeper writes optimization_results.yaml, and the
    report names the best trial."""
    pytest.importorskip(
        "hydra_plugins.hydra_optuna_sweeper", reason="Hydra's Optuna sweeper is not installed (pip install '.[optuna]')"
    )
    sweep_dir = tmp_path / "multirun"
    tiny = [o for o in TINY if not o.startswith("data.batch_size=")]  # the search picks it
    command = [
        sys.executable,
        str(TRAIN),
        "hparams_search=gpt_optuna",
        "hydra.sweeper.n_trials=2",
        "data.batch_size=choice(4, 8)",
        *tiny,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Sampler: TPESampler" in output
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    jobs = {}
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        results = json.loads((job / "results.json").read_text())
        assert results["global_step"] == 4
        assert results["metrics"]["val/ppl"] > 1
        assert 1e-4 <= float(overrides["model.lr"]) <= 1e-2
        assert overrides["data.batch_size"] in ("4", "8")
        jobs[job.name] = (
            float(overrides["model.lr"]),
            int(overrides["data.batch_size"]),
            results["metrics"]["val/ppl"],
        )
    assert sorted(jobs) == ["0", "1"]
    [best_job] = [name for name, (lr, bs, _) in jobs.items() if (lr, bs) == tuple(best["best_params"].values())]
    assert best["best_value"] == pytest.approx(jobs[best_job][2])
    assert best["best_value"] == min(ppl for _, _, ppl in jobs.values())
    shown = subprocess.run(
        [sys.executable, str(REPORT), str(sweep_dir), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"best trial (optimization_results.yaml): job {best_job}: model.lr=" in shown.stdout
    assert f"-> val/ppl {best['best_value']:.4g}" in shown.stdout
