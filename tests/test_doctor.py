"""``python -m lightning_gaudi.doctor``: the report a Gaudi owner attaches to an issue, from the installed package.

Its checks run here on the emulator and on the bridge double (the real-bridge code path, with CPU tensors standing for
the card's). From a wheel installed in a fresh virtual environment, outside the repository, they run in
``scripts/check-dist.sh`` (a CI step after the suite, which builds that wheel and venv anyway): every in-process check,
the all-reduce and the one-card fit on 2 emulated cards, and the report's rows checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from lightning_gaudi import doctor, hpu
from lightning_gaudi.doctor import checks, options, runner
from lightning_gaudi.doctor.checks import CHECKS, FAIL, PASS, SKIPPED, Outcome
from lightning_gaudi.hpu import LazyCounters, runtime
from lightning_gaudi.hpu.bridge import HabanaBackend

ROOT = Path(__file__).parent.parent


def _table_rows(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.split("## Checks", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] != "check":
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.subprocess
def test_importing_the_doctor_imports_no_pytest() -> None:
    code = "import sys, lightning_gaudi.doctor.runner; assert 'pytest' not in sys.modules, 'pytest imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize(
    ("out", "message"),
    [("missing/report.md", "does not exist"), (".", "is a folder")],
)
def test_out_is_checked_before_anything_runs(
    eager_hpu: hpu.Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    out: str,
    message: str,
) -> None:
    def never(*args: object) -> None:
        raise AssertionError("a check ran before --out was checked")

    monkeypatch.setattr(runner, "stack", never)
    monkeypatch.setattr(runner, "run_checks", never)
    assert doctor.main(["--out", str(tmp_path / out)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_bad_arguments_fail_at_once(eager_hpu: hpu.Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "r.md")
    assert doctor.main(["--out", out, "--only", "no such check"]) == 2
    assert "no such check" in capsys.readouterr().err
    assert doctor.main(["--out", out, "--timeout", "0"]) == 2
    assert not Path(out).exists()


def test_the_check_names_are_known_without_torch() -> None:
    """``--only`` is checked before torch loads, against :data:`options.CHECK_NAMES`: the checks' own names."""
    assert tuple(CHECKS) == options.CHECK_NAMES


@pytest.mark.parametrize(
    ("argv", "orig_argv", "is_doctor"),
    [
        ("-m --out r.md", "python -m lightning_gaudi.doctor --out r.md", True),
        ("-m", "python -X importtime -mlightning_gaudi.doctor", True),
        ("-m eager device", "python -m lightning_gaudi.doctor.worker eager device", False),
        ("-m -m lightning_gaudi.doctor", "python -m lightning_gaudi -m lightning_gaudi.doctor", False),
        ("-c --out", "python -c import_lightning_gaudi --out", False),
        ("/x/train.py", "python /x/train.py", False),
    ],
)
def test_the_doctor_is_recognized_while_python_dash_m_imports_its_package(
    argv: str, orig_argv: str, is_doctor: bool
) -> None:
    assert (options.running_module(argv.split(), orig_argv.split()) == options.MODULE) is is_doctor


def test_answer_early_returns_for_good_arguments_and_other_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = ["--out", str(tmp_path / "r.md"), "--only", "fit"]
    monkeypatch.setattr(sys, "argv", ["-m", *good])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "lightning_gaudi.doctor", *good])
    options.answer_early()
    monkeypatch.setattr(sys, "argv", ["-m", "--only", "nosuch"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "lightning_gaudi.doctor", "--only", "nosuch"])
    with pytest.raises(SystemExit) as stopped:
        options.answer_early()
    assert stopped.value.code == 2
    assert "no such check" in capsys.readouterr().err
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "other.tool", "--only", "nosuch"])
    options.answer_early()  # another module's arguments are not the doctor's


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["--only", "no such check"], 2, "no such check"),
        (["--out", "missing/r.md"], 2, "does not exist"),
        (["--bogus"], 2, "unrecognized arguments"),
        (["--help"], 0, "usage: python -m lightning_gaudi.doctor"),
    ],
)
def test_arguments_are_answered_before_torch_is_imported(args: list[str], status: int, says: str) -> None:
    """``python -m lightning_gaudi.doctor`` answers ``--help`` and refuses bad arguments before the parent package
    imports torch and Lightning (seconds): ``-X importtime`` lists every module imported."""
    command = [sys.executable, "-X", "importtime", "-m", "lightning_gaudi.doctor", *args]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == status, done.stderr[-2000:]
    assert says in done.stdout + done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "lightning_gaudi.doctor.options" in imported
    assert not [name for name in imported if name.split(".")[0] in ("torch", "lightning")], "torch was imported"
    assert elapsed < 10  # about 0.1 s; importing torch and Lightning took 3.5 to 8 s


def test_an_out_that_cannot_be_created_fails_before_anything_runs(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that passes the pre-check (the folder exists and is writable) but cannot be created, a link into a
    missing folder, fails at once (exit status 2), not after every check ran; so does a name too long to check."""

    def never(*args: object) -> None:
        raise AssertionError("a check ran before the report file was created")

    monkeypatch.setattr(runner, "stack", never)
    monkeypatch.setattr(runner, "run_checks", never)
    out = tmp_path / "r.md"
    out.symlink_to(tmp_path / "missing" / "r.md")
    assert options.check_out(out) is None
    assert doctor.main(["--out", str(out)]) == 2
    assert "cannot be written: No such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
    assert doctor.main(["--out", str(tmp_path / ("r" * 300 + ".md"))]) == 2
    assert "cannot be used: File name too long" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r.md"]  # the link, left alone


def test_the_report_is_written_as_rows_complete(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file exists before the first check runs and holds each row as it completes: a run that stops half-way
    (here an error in the runner itself) leaves the rows it had, marked incomplete."""
    out = tmp_path / "r.md"
    seen: list[str] = []

    def run_checks(env: object, timeout: float, only: object, work: Path, done: runner.Done) -> dict[str, Outcome]:
        seen.append(out.read_text())
        done("device", Outcome(PASS, "eager backend", "2 x GAUDI2"))
        seen.append(out.read_text())
        raise RuntimeError("the runner broke")

    monkeypatch.setattr(runner, "run_checks", run_checks)
    with pytest.raises(RuntimeError, match="the runner broke"):
        doctor.main(["--out", str(out)])
    assert "RUNNING" in seen[0]
    assert f"| torch | {torch.__version__} |" in seen[0]  # the stack, read before the checks
    assert _table_rows(seen[0]) == {}
    assert _table_rows(seen[1]) == {"device": [PASS, "2 x GAUDI2", "eager backend"]}
    final = out.read_text()
    assert _table_rows(final) == {"device": [PASS, "2 x GAUDI2", "eager backend"]}
    assert "INCOMPLETE: the run stopped (RuntimeError: the runner broke) before it finished." in final
    assert "RUNNING" not in final
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r.md"]  # no temporary file left


def test_a_report_that_cannot_be_written_at_the_end_is_printed(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    out = folder / "r.md"

    def run_checks(env: object, timeout: float, only: object, work: Path, done: runner.Done) -> dict[str, Outcome]:
        out.unlink()
        folder.rmdir()  # the folder went away during the run
        done("device", Outcome(PASS, "eager backend", "2 x GAUDI2"))
        return {"device": Outcome(PASS, "eager backend", "2 x GAUDI2")}

    monkeypatch.setattr(runner, "run_checks", run_checks)
    assert doctor.main(["--out", str(out)]) == 1
    printed = capsys.readouterr()
    assert _table_rows(printed.out) == {"device": [PASS, "2 x GAUDI2", "eager backend"]}
    assert "could not be written" in printed.err


def test_without_gaudi_software_the_rows_say_not_installed(no_hpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyhlml", None)  # not installed
    rows = dict(runner.stack(os.environ))
    for name in ("Gaudi software (habana-torch-plugin)", "cards (pyhlml)", "lazy mode in this build"):
        assert rows[name].startswith("not installed"), (name, rows[name])
    assert "habana_frameworks" in rows["lazy mode in this build"]


def test_tests_need_a_checkout(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor.main(["--out", str(tmp_path / "r.md"), "--tests", str(tmp_path)]) == 2
    assert "is not a lightning_gaudi source checkout" in capsys.readouterr().err


def test_a_failed_check_makes_the_exit_status_1(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[float, list[str] | None]] = []

    def run_checks(env: object, timeout: float, only: list[str] | None, work: Path, done: object) -> dict[str, Outcome]:
        ran.append((timeout, only))
        return {"device": Outcome(PASS, "eager backend"), "fused AdamW": Outcome(FAIL, "timed out after 1 s (stopped)")}

    monkeypatch.setattr(runner, "run_checks", run_checks)
    out = tmp_path / "r.md"
    assert doctor.main(["--out", str(out), "--only", "fused AdamW", "--timeout", "1"]) == 1
    assert ran == [(1.0, ["fused AdamW"])]
    assert _table_rows(out.read_text())["fused AdamW"] == [FAIL, "", "timed out after 1 s (stopped)"]
    monkeypatch.setattr(runner, "run_checks", lambda *args: {"device": Outcome(PASS, "eager backend")})
    assert doctor.main(["--out", str(out)]) == 0


def test_without_a_bridge_or_emulation_nothing_can_run(no_hpu: None, tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    assert doctor.main(["--out", str(out)]) == 1
    report = out.read_text()
    assert "NOTHING COULD RUN" in report
    assert f"| torch | {torch.__version__} |" in report
    assert "0 passed, 0 failed, 0 skipped" in report


def test_the_cards_are_read_through_pyhlml(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = ModuleType("pyhlml")
    fake.hlmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.hlmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    fake.hlmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    fake.hlmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    fake.hlmlDeviceGetName = lambda handle: b"HL-325L"  # type: ignore[attr-defined]
    fake.hlmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(total=128 * 2**30)  # type: ignore[attr-defined]
    fake.hlmlDeviceGetFirmwareFITVersion = lambda handle: b"1.24.0-fw"  # type: ignore[attr-defined]
    fake.hlmlGetDriverVersion = lambda: b"1.24.0-abc"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyhlml", fake)
    rows = dict(runner.stack(os.environ))
    assert rows["cards (pyhlml)"] == (
        "2 card(s): HL-325L 128 GiB, HL-325L 128 GiB; driver 1.24.0-abc; firmware 1.24.0-fw"
    )
    assert calls == ["init", "shutdown"]
    monkeypatch.setitem(sys.modules, "pyhlml", None)  # not installed
    assert "pip install habana-pyhlml" in dict(runner.stack(os.environ))["cards (pyhlml)"]


def test_the_report_has_a_row_per_check_with_its_figure() -> None:
    results = {
        "device": Outcome(PASS, "eager backend", "2 x GAUDI3"),
        "FP8": Outcome(SKIPPED, "no FP8 | here"),
        "RoPE": Outcome(FAIL, "differs", "max error 1e+00"),
    }
    text = runner.report([("torch", "2.x")], results, ["a note"])
    assert "1 passed, 1 failed, 1 skipped." in text
    assert _table_rows(text) == {
        "device": ["pass", "2 x GAUDI3", "eager backend"],
        "FP8": ["skipped", "", "no FP8 \\| here"],
        "RoPE": ["fail", "max error 1e+00", "differs"],
    }
    assert text.rstrip().endswith("a note")


@pytest.fixture
def double_on_the_cpu(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bridge path on the double, its "card" the CPU (the double cannot make ``hpu`` tensors)."""
    monkeypatch.setattr(HabanaBackend, "device", lambda self, index=None: torch.device("cpu"))
    bridge_double.configure(lazy=True)  # lazy mode, whatever PT_HPU_LAZY_MODE says: the lazy-only checks run too
    return bridge_double


@pytest.mark.parametrize(
    # not autocast (torch's "hpu" autocast needs the card's tensors), nor compile mode ("hpu_backend" is the bridge's)
    "name",
    [name for name in CHECKS if name not in ("bf16 autocast", "throughput, compile mode", "throughput, eager mode")],
)
def test_each_check_passes_on_the_bridge_path(double_on_the_cpu: ModuleType, name: str) -> None:
    outcome = CHECKS[name][1](hpu.get_backend())
    assert outcome.status == PASS, outcome
    assert outcome.reason
    if name not in ("device",):
        assert "emulated" not in outcome.reason  # the bridge's kernels, not the emulator's stand-ins
    if name in ("FusedSDPA", "FusedRMSNorm", "RoPE"):
        assert "max error" in outcome.figure


def test_the_report_on_the_bridge_double(double_on_the_cpu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole report's shape on the bridge path: the stack, then a row per check with its figure."""
    monkeypatch.delenv(hpu.EMULATE_ENV, raising=False)
    backend = hpu.get_backend()
    names = [name for name in CHECKS if name not in ("bf16 autocast", "throughput, compile mode")]
    text = runner.report(runner.stack(os.environ), {name: CHECKS[name][1](backend) for name in names}, [])
    stack_rows = text.split("## Checks")[0]
    assert "| Gaudi software (habana-torch-plugin) | not installed |" in stack_rows  # the double has no metadata
    assert "| lazy mode in this build |" in stack_rows
    assert hpu.EMULATE_ENV not in stack_rows
    rows = _table_rows(text)
    assert list(rows) == names
    assert all(status == PASS and figure for status, figure, _ in rows.values() if status != SKIPPED), rows
    assert rows["device"][1] == "8 x GAUDI2"
    assert f"{len(names)} passed, 0 failed, 0 skipped." in text


def test_the_bridge_paths_kernels_are_the_ones_checked(double_on_the_cpu: ModuleType) -> None:
    backend = hpu.get_backend()
    for name in ("FusedSDPA", "FusedRMSNorm", "RoPE", "fused AdamW", "fused clip norm", "FP8", "HPU graphs"):
        CHECKS[name][1](backend)
    called = set(double_on_the_cpu.names())
    expected = {
        "hpex.FusedSDPA.apply",
        "hpex.FusedRMSNorm.apply",
        "hpex.RotaryPosEmbeddingHelperV1.apply",
        "hpex.FusedAdamW",
        "hpex.FusedClipNorm.clip_norm",
        "te.fp8_autocast",
        "hpu.wrap_in_hpu_graph",
        "hpu.graph_replay",
    }
    assert expected <= called


def test_a_wrong_kernel_fails_its_check(double_on_the_cpu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from habana_frameworks.torch.hpex.normalization import FusedRMSNorm

    right = FusedRMSNorm.apply
    monkeypatch.setattr(FusedRMSNorm, "apply", staticmethod(lambda x, w, eps, *rest: right(x, w, eps) * 1.01))
    outcome = checks.rms_norm_check(hpu.get_backend())
    assert outcome.status == FAIL
    assert "FusedRMSNorm differs from the reference math" in outcome.reason


def test_a_cache_miss_every_step_fails_mark_step(
    double_on_the_cpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = hpu.get_backend()
    monkeypatch.setattr(backend, "lazy_counters", lambda: LazyCounters(graph_compilations=1))
    outcome = checks.mark_step_check(backend)
    assert outcome.status == FAIL
    assert "compiled a new graph" in outcome.reason


def test_eager_mode_on_the_bridge_skips_the_lazy_only_checks(
    double_on_the_cpu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    double_on_the_cpu.configure(lazy=False)
    backend = hpu.get_backend()
    assert checks.mark_step_check(backend).status == SKIPPED
    assert checks.hpu_graphs_check(backend).status == SKIPPED


def test_a_first_generation_gaudi_skips_fp8(double_on_the_cpu: ModuleType) -> None:
    double_on_the_cpu.configure(device_name="GAUDI")
    outcome = checks.fp8_check(hpu.get_backend())
    assert outcome.status == SKIPPED
    assert "GAUDI has no FP8" in outcome.reason


#: The bridge's error for a card that cannot hold 24 MiB more (gaudi-pytorch-bridge v1.19.0,
#: backend/synapse_helpers/device_memory.cpp:1060-1065).
DEVMEM_OOM = "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::25165824 (24)MB"


def test_a_check_out_of_device_memory_says_so(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker runs the check in its process; the bridge's PT_DEVMEM error is reported as the card running out."""
    from lightning_gaudi.doctor import worker

    def out_of_memory(backend: hpu.Backend) -> Outcome:
        raise RuntimeError(DEVMEM_OOM)

    monkeypatch.setitem(CHECKS, "memory_stats", ("eager", out_of_memory))
    monkeypatch.setitem(CHECKS, "FusedSDPA", ("eager", lambda backend: 1 / 0))
    assert worker.main(["eager", "memory_stats", "FusedSDPA"]) == 0
    outcomes = {}
    for line in capsys.readouterr().out.splitlines():
        message = json.loads(line[len(worker.MARK) :])
        if "name" in message:
            name = message.pop("name")
            outcomes[name] = Outcome(**message)
    oom = outcomes["memory_stats"]
    assert oom.status == FAIL
    assert oom.reason.startswith(f"out of device memory on the GAUDI2: RuntimeError: {DEVMEM_OOM} (test_doctor.py:")
    assert "hl-smi" in oom.reason
    other = outcomes["FusedSDPA"]
    assert other.status == FAIL
    assert other.reason.startswith("ZeroDivisionError: division by zero (test_doctor.py:"), "other errors as before"


def test_the_doctor_recognises_the_bridge_doubles_out_of_memory(double_on_the_cpu: ModuleType) -> None:
    double_on_the_cpu.configure(lazy=False, memory={"Limit": 8 * 2**20})
    with pytest.raises(RuntimeError) as error:
        double_on_the_cpu.run_ops(16 * 2**20)
    outcome = checks.failure(hpu.get_backend(), error.value)
    assert outcome.status == FAIL
    assert outcome.reason.startswith("out of device memory on the GAUDI2: RuntimeError: [Rank:0] FATAL ERROR ::")


def test_stock_pytorch_builds_skip_lazy_mode(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hpu.EMULATE_ENV)
    why = "this Gaudi software runs on stock PyTorch (torch 2.10.0), where Intel's bridge has no lazy mode"
    monkeypatch.setattr(runner.runtime, "lazy_mode_unavailable", lambda: why)
    monkeypatch.setattr(runner.runtime, "bridge_installed", lambda: True)
    lazy = [name for name, (mode, _) in CHECKS.items() if mode == "lazy"]
    results = runner.run_checks(os.environ, 60, lazy, Path("."))
    assert {name: (r.status, r.reason) for name, r in results.items()} == dict.fromkeys(
        lazy, (SKIPPED, f"no lazy mode: {why}")
    )
    rows = dict(runner.stack(os.environ))
    assert rows["lazy mode in this build"] == f"no: {why}"


@pytest.mark.subprocess
def test_a_check_that_overruns_is_stopped_and_fails(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    env = {**os.environ, hpu.EMULATE_ENV: "eager"}
    start = time.monotonic()
    results = runner.run_group("eager", ["device", "memory_stats"], env, 0.5, tmp_path)
    assert time.monotonic() - start < 60
    # the worker's start-up (importing torch) outlasts half a second: the first check fails, the next gets a new worker
    assert results["device"].status == FAIL
    assert "timed out after 0.5 s" in results["device"].reason
    assert set(results) == {"device", "memory_stats"}


@pytest.mark.subprocess
def test_tests_from_a_checkout_run_the_bridge_tests_on_the_double(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tests`` on a "Gaudi" (the double installed where Intel's bridge would be) runs ``pytest -m bridge
    --real-bridge``; the command is recorded, not run."""
    recorded: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        recorded.append(command)
        return subprocess.CompletedProcess(command, 0, "3 passed, 1 skipped in 0.1s", "")

    monkeypatch.setattr(runner.subprocess, "run", run)
    code, section = runner.repository_tests(ROOT, gaudi=True, timeout=60)
    assert code == 0
    ((*_, first, second, third),) = [recorded[0][-3:]]
    assert [first, second, third] == ["--real-bridge", "-m", "bridge"]
    assert "3 passed, 1 skipped" in section


def test_the_stack_names_the_compile_and_recipe_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a requeue's warmth lives (issue 43): the policy's folder, and the recipe cache a Gaudi gets."""
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(runtime.RECIPE_CACHE_ENV, raising=False)
    rows = dict(runner.stack(os.environ))
    assert rows["compile cache (torch)"] == f"{tmp_path}, a folder per key"
    assert rows[f"recipe cache on a Gaudi ({runtime.RECIPE_CACHE_ENV})"].startswith(f"{tmp_path}/recipes-torch")
    monkeypatch.setenv(runtime.RECIPE_CACHE_ENV, "/mine,false,1024")
    assert dict(runner.stack(os.environ))[f"recipe cache on a Gaudi ({runtime.RECIPE_CACHE_ENV})"] == (
        "/mine,false,1024 (yours)"
    )
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, "off")
    monkeypatch.delenv(runtime.RECIPE_CACHE_ENV)
    rows = dict(runner.stack(os.environ))
    assert rows["compile cache (torch)"].startswith("off")
    assert rows[f"recipe cache on a Gaudi ({runtime.RECIPE_CACHE_ENV})"] == "none"
