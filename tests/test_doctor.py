"""``python -m lightning_gaudi.doctor``: the report a Gaudi owner attaches to an issue.

Its real-bridge branch runs here against the bridge double (which stands where Intel's bridge would): in-process with
the test runs recorded, and once for real, the bridge-path tests running on the "real" bridge (``--real-bridge``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_gaudi import doctor, hpu

ROOT = Path(__file__).parent.parent
BRIDGE_DOUBLE_DIR = ROOT / "tests" / "bridge_double"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    commands: list[list[str]] = []

    def run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        commands.append(command)
        return 0, "3 passed, 1 skipped in 0.1s"

    monkeypatch.setattr(doctor, "_run", run)
    return commands


@pytest.mark.subprocess
def test_importing_the_doctor_imports_no_pytest() -> None:
    code = "import sys, lightning_gaudi.doctor; assert 'pytest' not in sys.modules, 'pytest imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_without_a_gaudi_it_says_so_and_runs_the_emulators_checks(
    no_hpu: None, recorded: list[list[str]], tmp_path: Path
) -> None:
    out = tmp_path / "report.md"
    assert doctor.main(["--out", str(out)]) == 0
    report = out.read_text()
    assert "NO GAUDI in use here" in report
    assert "Intel's bridge (habana_frameworks.torch) is not installed" in report
    assert f"| torch | {__import__('torch').__version__} |" in report
    (command,) = recorded
    assert "--real-bridge" not in command
    assert [*doctor.EMULATOR_CHECKS] == command[-len(doctor.EMULATOR_CHECKS) :]
    assert "3 passed, 1 skipped" in report


def test_on_a_gaudi_it_runs_the_bridge_tests_and_the_benchmarks(
    bridge_double: ModuleType, recorded: list[list[str]], tmp_path: Path
) -> None:
    out = tmp_path / "report.md"
    assert doctor.main(["--out", str(out), "--quick"]) == 0
    report = out.read_text()
    assert "A Gaudi is in use" in report
    assert "habana: 8 x GAUDI2, Intel's bridge" in report
    tests, benchmarks = recorded
    assert "--real-bridge" in tests
    assert tests[tests.index("-n") + 1] == "0"  # one process: not the suite's test workers on the cards
    assert tests[-2:] == ["-m", "bridge and not subprocess"]
    assert benchmarks[1:3] == ["-m", "benchmarks.gaudi"]
    assert benchmarks[-1] == "--quick"


def test_from_a_wheel_it_says_it_needs_a_checkout(
    eager_hpu: hpu.Backend, recorded: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "ROOT", tmp_path)
    out = tmp_path / "report.md"
    assert doctor.main(["--out", str(out)]) == 1  # no test ran: nothing shown to work
    assert "run the doctor from a source checkout" in out.read_text().lower()
    assert recorded == []


def test_without_pytest_it_says_so_and_exits_non_zero(
    eager_hpu: hpu.Backend, recorded: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = doctor.importlib.util.find_spec

    def without_pytest(name: str, *args: Any) -> Any:
        return None if name == "pytest" else find_spec(name, *args)

    monkeypatch.setattr(doctor.importlib.util, "find_spec", without_pytest)
    out = tmp_path / "report.md"
    assert doctor.main(["--out", str(out)]) == 1
    assert "Tests NOT RUN: pytest or pytest-xdist is not installed" in out.read_text()
    assert recorded == []


def test_an_unwritable_report_path_is_refused_before_anything_runs(
    eager_hpu: hpu.Backend, recorded: list[list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no such folder" / "report.md"
    with pytest.raises(SystemExit) as exited:
        doctor.main(["--out", str(out)])
    assert exited.value.code == 2
    assert f"--out {out}: the report cannot be written there" in capsys.readouterr().err
    assert recorded == []  # no test ran first
    writable = tmp_path / "report.md"
    doctor.main(["--out", str(writable)])
    assert writable.is_file()


@pytest.mark.subprocess
def test_the_real_bridge_branch_runs_the_bridge_tests_on_the_double(tmp_path: Path) -> None:
    """The whole kit as on a Gaudi, with the double where Intel's bridge would be installed."""
    env = {k: v for k, v in os.environ.items() if k not in (hpu.EMULATE_ENV, hpu.DEVICES_ENV, hpu.DEVICE_NAME_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(BRIDGE_DOUBLE_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "lightning_gaudi.doctor", "--out", str(out), "--quick", "--no-benchmarks"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = out.read_text()
    assert done.returncode == 0, report
    assert "A Gaudi is in use" in report
    assert "exit status 0" in report
    assert " passed" in report
    assert "the real bridge lacks" in report, "tests that read the double's call log skip, saying why"
