"""What works on this machine, in one report to attach to an issue: ``python -m lightning_gaudi.doctor [--out FILE]``.

It reports the stack (Gaudi software, driver, torch, Lightning, DeepSpeed, the cards the backend sees). On a Gaudi it
runs the bridge-path tests (``pytest -m bridge --real-bridge``: the tests written against tests/bridge_double, on
Intel's bridge) and ``benchmarks/gaudi.py``; elsewhere it says so and runs a short selection of the emulator's tests.
It needs a source checkout (tests/ and benchmarks/ beside the package) and pytest, which it runs in a subprocess.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The emulator's checks: the seam, the accelerator, the dynamo readers, one Trainer fit per mode.
EMULATOR_CHECKS = ("tests/test_accelerator.py", "tests/hpu/test_runtime.py", "tests/callbacks/test_dynamo.py")
#: Lines of pytest's and the benchmark's output kept in the report.
TAIL = 120


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | str, str]:
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout or ""
        return f"timed out after {timeout:.0f} s", out
    except OSError as error:
        return f"could not start ({error})", ""
    return done.returncode, done.stdout + done.stderr


def stack() -> tuple[list[tuple[str, str]], bool]:
    """The stack as (name, value) rows, and whether a real Gaudi is in use (Intel's bridge, no emulation)."""
    import lightning
    import torch

    import lightning_gaudi
    from lightning_gaudi import hpu

    rows = [
        ("lightning_gaudi", f"{lightning_gaudi.__version__} ({Path(lightning_gaudi.__file__).parent})"),
        ("python / platform", f"{platform.python_version()} / {platform.platform()}"),
        ("torch", torch.__version__),
        ("lightning", lightning.__version__),
        ("deepspeed", _version("deepspeed")),
    ]
    if hpu.bridge_installed():
        rows.append(("Gaudi software (habana-torch-plugin)", _version("habana-torch-plugin")))
    else:
        rows.append(("Gaudi software", "Intel's bridge (habana_frameworks.torch) is not installed"))
    if shutil.which("hl-smi"):
        code, out = _run(["hl-smi", "-Q", "driver_version,name", "-f", "csv,noheader"], timeout=60)
        rows.append(("hl-smi (driver, card)", "; ".join(sorted(set(out.split("\n")) - {""})) or f"failed: {code}"))
    else:
        rows.append(("hl-smi", "not found"))
    gaudi = False
    try:
        backend = hpu.get_backend()
        gaudi = not backend.emulated and backend.is_available()
        what = "EMULATED on the CPU" if backend.emulated else "Intel's bridge"
        rows.append(("backend", f"{backend.name}: {backend.device_count()} x {backend.device_name()}, {what}"))
    except Exception as error:  # no bridge and no emulation, or a bridge that fails: both are what the report is for
        rows.append(("backend", f"none ({type(error).__name__}: {str(error).splitlines()[0][:200]})"))
    if hpu.emulation_mode() is not None:
        rows.append((hpu.EMULATE_ENV, f"{os.environ[hpu.EMULATE_ENV]} (unset it to use a Gaudi)"))
    return rows, gaudi


def _section(title: str, command: list[str], result: tuple[int | str, str]) -> str:
    code, out = result
    tail = "\n".join(out.rstrip().splitlines()[-TAIL:])
    return f"## {title}\n\n`{shlex.join(command)}`: exit status {code}\n\n```\n{tail}\n```\n"


def main(argv: list[str] | None = None) -> int:
    """Writes the report; returns 0 when every check it ran passed."""
    parser = argparse.ArgumentParser(prog="python -m lightning_gaudi.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("lightning_gaudi_doctor.md"), help="the report to write")
    parser.add_argument("--quick", action="store_true", help="benchmarks --quick, tests without subprocess ones")
    parser.add_argument("--no-benchmarks", action="store_true", help="leave out benchmarks/gaudi.py")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for each step (default 3600)")
    args = parser.parse_args(argv)
    _check_writable(parser, args.out)  # before the tests, which take up to an hour on a Gaudi
    print("lightning_gaudi.doctor: reading the stack", file=sys.stderr)
    rows, gaudi = stack()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# lightning_gaudi doctor report ({now})\n", "| | |\n|---|---|"]
    parts += [f"| {name} | {value} |" for name, value in rows]
    parts.append("")
    results: list[int | str] = []
    ran_tests = False
    source = (ROOT / "tests" / "conftest.py").is_file() and (ROOT / "benchmarks" / "gaudi.py").is_file()
    if not source:
        parts.append(
            f"Tests and benchmarks NOT RUN: lightning_gaudi is installed at {ROOT} without tests/ and benchmarks/"
            " (a wheel). Run the doctor from a source checkout: `git clone` the project, `pip install -e '.[dev]'`"
            " inside your Gaudi environment, then `python -m lightning_gaudi.doctor` in the checkout.\n"
        )
    elif importlib.util.find_spec("pytest") is None or importlib.util.find_spec("xdist") is None:
        parts.append("Tests NOT RUN: pytest or pytest-xdist is not installed (`pip install -e '.[dev]'`).\n")
    else:
        # -n 0: one process, so the tests take the cards one at a time and the report reads in order
        pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rfEs", "--no-header"]
        if gaudi:
            parts.append("A Gaudi is in use: the bridge-path tests ran on Intel's bridge, then benchmarks/gaudi.py.\n")
            command = [*pytest, "--real-bridge", "-m", "bridge and not subprocess" if args.quick else "bridge"]
        else:
            parts.append("NO GAUDI in use here: the emulator's checks ran instead (on the CPU).\n")
            command = [*pytest, "-m", "not subprocess", *EMULATOR_CHECKS]
        print(f"lightning_gaudi.doctor: {' '.join(command[2:])}", file=sys.stderr)
        result = _run(command, args.timeout)
        results.append(result[0])
        ran_tests = True
        parts.append(_section("Tests", command, result))
        if gaudi and not args.no_benchmarks:
            with tempfile.TemporaryDirectory() as out:
                command = [sys.executable, "-m", "benchmarks.gaudi", "--out", out, *(["--quick"] if args.quick else [])]
                print(f"lightning_gaudi.doctor: {' '.join(command[2:])}", file=sys.stderr)
                result = _run(command, args.timeout)
                results.append(result[0])
                table = Path(out) / "table.md"
                parts.append(_section("benchmarks/gaudi.py", command, result))
                if table.is_file():
                    parts.append(table.read_text())
    args.out.write_text("\n".join(parts))
    print(f"lightning_gaudi.doctor: wrote {args.out.resolve()}: attach it to your issue", file=sys.stderr)
    return 0 if ran_tests and all(code == 0 for code in results) else 1  # no test run: nothing was shown to work


def _check_writable(parser: argparse.ArgumentParser, out: Path) -> None:
    existed = out.exists()
    try:
        with open(out, "a"):
            pass
    except OSError as err:
        parser.error(f"--out {out}: the report cannot be written there ({err.strerror}). Pass a writable path.")
    if not existed:
        out.unlink()


if __name__ == "__main__":
    sys.exit(main())
