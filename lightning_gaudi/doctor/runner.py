"""The doctor's run, once :mod:`lightning_gaudi.doctor.options` has accepted the arguments: the stack, the checks
(each in a worker process), and the report file, created first and rewritten as each row completes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from lightning_gaudi.doctor.checks import CHECKS, FAIL, PASS, SKIPPED, Outcome
from lightning_gaudi.doctor.worker import MARK, mode_environment
from lightning_gaudi.hpu import runtime

__all__ = ["Outcome", "ReportFile", "run"]

#: Called with each check's name and outcome as it completes (the report file is rewritten then).
Done = Callable[[str, Outcome], None]
#: The emulator's test selection that ``--tests`` runs without a Gaudi.
EMULATOR_TESTS = ("tests/test_accelerator.py", "tests/hpu/test_runtime.py", "tests/callbacks/test_dynamo.py")
#: The strategies a short fit runs on, with the cards each takes (``hpu_parallel``: every card pair).
FIT_STRATEGIES = {"hpu_single": 1, "hpu_parallel": 2, "hpu_fsdp": 2, "hpu_model_parallel": 2, "hpu_deepspeed": 2}
#: The most cards the all-reduce spans.
MAX_CARDS = 8


def _version(*distributions: str) -> str:
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cards() -> str:
    """The cards as Intel's management library reports them (``pyhlml``, from ``habana-pyhlml``), or why not."""
    try:
        import pyhlml
    except ModuleNotFoundError:
        return "not installed (habana-pyhlml; `pip install habana-pyhlml` on a Gaudi)"
    except Exception as error:  # installed, but its shared library is missing
        return f"not read: pyhlml is not usable ({type(error).__name__}); `pip install habana-pyhlml` on a Gaudi"
    try:
        pyhlml.hlmlInit()
        try:
            cards, firmware = [], ""
            for index in range(pyhlml.hlmlDeviceGetCount()):
                handle = pyhlml.hlmlDeviceGetHandleByIndex(index)
                memory = pyhlml.hlmlDeviceGetMemoryInfo(handle)
                cards.append(f"{_text(pyhlml.hlmlDeviceGetName(handle))} {memory.total / 2**30:.0f} GiB")
                firmware = firmware or _text(pyhlml.hlmlDeviceGetFirmwareFITVersion(handle))
            driver = _text(pyhlml.hlmlGetDriverVersion())
            return f"{len(cards)} card(s): {', '.join(cards)}; driver {driver}; firmware {firmware or '?'}"
        finally:
            pyhlml.hlmlShutdown()
    except Exception as error:
        return f"pyhlml failed: {type(error).__name__}: {error}"


def stack(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The stack as (name, value) rows, read without importing Intel's bridge."""
    import lightning_gaudi

    fork = " (Intel's Gaudi fork)" if "+hpu" in _version("deepspeed") else ""
    rows = [
        ("lightning_gaudi", f"{lightning_gaudi.__version__} ({Path(lightning_gaudi.__file__).parent})"),
        ("Python / platform", f"{platform.python_version()} / {platform.platform()}"),
        ("torch", torch.__version__),  # the build's own, with its local part (Intel's fork, a CUDA build)
        ("Lightning", _version("lightning", "pytorch-lightning")),
        ("DeepSpeed", _version("deepspeed") + fork),
        ("Intel Neural Compressor", _version("neural-compressor-pt", "neural-compressor")),
        ("Gaudi software (habana-torch-plugin)", _version("habana-torch-plugin")),
        ("cards (pyhlml)", _cards()),
    ]
    if not runtime.bridge_installed():
        lazy = "not installed (no Gaudi software: habana_frameworks)"
    else:
        why = runtime.lazy_mode_unavailable()
        lazy = "no: " + why if why else "yes, or cannot tell"
    rows.append(("lazy mode in this build", lazy))
    root = runtime.compile_cache_root(environ)
    off = f"off ({runtime.COMPILE_CACHE_ENV}): torch's own folders"
    rows.append(("compile cache (torch)", f"{root}, a folder per key" if root else off))
    recipes = environ.get(runtime.RECIPE_CACHE_ENV) or None
    default = runtime.default_recipe_cache(environ)
    rows.append(
        (
            f"recipe cache on a Gaudi ({runtime.RECIPE_CACHE_ENV})",
            f"{recipes} (yours)" if recipes else f"{default.path} (the default)" if default else "none",
        )
    )
    mode = runtime.emulation_mode(environ)
    if mode is not None:
        rows.append((runtime.EMULATE_ENV, f"{mode}: the checks ran on the CPU emulator (unset it on a Gaudi)"))
    return rows


def _stop(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _start(command: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as stderr:
        return subprocess.Popen(
            command, env=dict(env), stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )


def _tail(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " / ".join(lines[-3:])[-600:]


def _forward(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Puts the worker's marked lines on ``lines``, then ``None`` when its stdout closes."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(MARK):
            lines.put(line[len(MARK) :])
    lines.put(None)


def _ignore(name: str, outcome: Outcome) -> None:
    pass


def run_group(
    mode: str, names: list[str], env: Mapping[str, str], timeout: float, work: Path, done: Done = _ignore
) -> dict[str, Outcome]:
    """Runs checks ``names`` in a worker process for ``mode``, a new worker after one that overran or died; each
    outcome goes to ``done`` as it comes."""
    results: dict[str, Outcome] = {}

    def record(name: str, outcome: Outcome) -> None:
        results[name] = outcome
        pending.remove(name)
        print(f"lightning_gaudi.doctor: {name}: {outcome.status} {outcome.figure}", file=sys.stderr)
        done(name, outcome)

    pending = list(names)
    while pending:
        log = work / f"worker-{mode}-{len(results)}.log"
        process = _start([sys.executable, "-m", "lightning_gaudi.doctor.worker", mode, *pending], env, log)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_forward, args=(process, lines), daemon=True).start()
        current: str | None = None
        deadline = time.monotonic() + timeout  # the worker's start-up counts against the first check
        while pending:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _stop(process)
                record(current or pending[0], Outcome(FAIL, f"timed out after {timeout:g} s (stopped)"))
                break
            if line is None:  # the worker ended early: the check it was in killed it
                code = process.wait()
                record(current or pending[0], Outcome(FAIL, f"its process ended with exit status {code}: {_tail(log)}"))
                break
            message = json.loads(line)
            if "start" in message:
                current, deadline = message["start"], time.monotonic() + timeout
                continue
            record(message.pop("name"), Outcome(**message))
            current, deadline = None, time.monotonic() + timeout
        else:
            process.wait()
    return results


def run_process(command: list[str], env: Mapping[str, str], timeout: float, work: Path) -> Outcome:
    """One multi-process check: ``command`` writes its outcome to the JSON file named by its last argument."""
    out = Path(command[-1])
    log = work / f"{out.stem}.log"
    process = _start(command, env, log)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        return Outcome(FAIL, f"timed out after {timeout:g} s (stopped): {_tail(log)}")
    if process.returncode != 0 or not out.is_file():
        return Outcome(FAIL, f"exit status {process.returncode}: {_tail(log)}")
    return Outcome(**json.loads(out.read_text()))


def _card_pairs(devices: int, env: Mapping[str, str], emulated: bool) -> list[tuple[str, str]]:
    if emulated:
        return [("0", "1")]  # emulated cards share one CPU: one pair says all
    modules = [m.strip() for m in env.get("HABANA_VISIBLE_MODULES", "").split(",") if m.strip()]
    modules = modules or [str(index) for index in range(devices)]
    return [(modules[i], modules[i + 1]) for i in range(0, len(modules) - 1, 2)]


def multi_process_checks(
    devices: int,
    emulated: bool,
    env: Mapping[str, str],
    timeout: float,
    work: Path,
    only: list[str] | None = None,
    done: Done = _ignore,
) -> dict[str, Outcome]:
    """The all-reduce and a short fit per strategy (those named by ``only``), each in its own processes; each outcome
    goes to ``done`` as it comes."""
    results: dict[str, Outcome] = {}

    def record(name: str, outcome: Outcome) -> None:
        results[name] = outcome
        print(f"lightning_gaudi.doctor: {name}: {outcome.status} {outcome.figure}", file=sys.stderr)
        done(name, outcome)

    def wanted(name: str) -> bool:
        return only is None or name.startswith(tuple(only))

    env = mode_environment(env, "eager") if emulated else dict(env)  # lazy emulation has no collectives
    module = [sys.executable, "-m", "lightning_gaudi.doctor.multi"]
    cards = min(devices, MAX_CARDS)
    if wanted("all-reduce"):
        record(
            "all-reduce",
            Outcome(SKIPPED, f"needs 2 cards, {devices} seen")
            if cards < 2
            else run_process([*module, "allreduce", str(cards), str(work / "allreduce.json")], env, timeout, work),
        )
    for strategy, needed in FIT_STRATEGIES.items():
        if not wanted(f"fit, {strategy}"):
            continue
        if strategy == "hpu_deepspeed" and _version("deepspeed") == "not installed":
            record(f"fit, {strategy}", Outcome(SKIPPED, "DeepSpeed is not installed"))
            continue
        if needed > devices:
            record(f"fit, {strategy}", Outcome(SKIPPED, f"needs {needed} cards, {devices} seen"))
            continue
        pairs = _card_pairs(devices, env, emulated) if strategy == "hpu_parallel" else [None]
        for pair in pairs:
            name = f"fit, {strategy}" + (f", cards {','.join(pair)}" if pair and not emulated else "")
            run_env = dict(env)
            if pair and not emulated:
                run_env["HABANA_VISIBLE_MODULES"] = ",".join(pair)
            out = work / f"fit-{strategy}-{'-'.join(pair or ())}.json"
            record(name, run_process([*module, "fit", strategy, str(needed), str(out)], run_env, timeout, work))
    return results


def run_checks(
    env: Mapping[str, str], timeout: float, only: list[str] | None, work: Path, done: Done = _ignore
) -> dict[str, Outcome]:
    """Every check (or those named in ``only``), by name, in the report's order; each outcome goes to ``done`` as it
    comes."""
    emulated = runtime.emulation_mode(env) is not None
    wanted = [name for name in CHECKS if only is None or name in only]
    results: dict[str, Outcome] = {}
    for mode in ("eager", "compile", "lazy"):
        names = [name for name in wanted if CHECKS[name][0] == mode]
        if not names:
            continue
        why = None if emulated or mode != "lazy" else runtime.lazy_mode_unavailable()
        if why is not None:
            for name in names:
                results[name] = Outcome(SKIPPED, f"no lazy mode: {why}")
                done(name, results[name])
            continue
        results.update(run_group(mode, names, mode_environment(env, mode), timeout, work, done))
    if only is None or any(name.startswith(("fit", "all-reduce")) for name in only):  # they need the card count
        device = results.get("device")
        if device is None:
            device = run_group("eager", ["device"], mode_environment(env, "eager"), timeout, work)["device"]
        if device.status == PASS:
            results.update(multi_process_checks(device.data["devices"], emulated, env, timeout, work, only, done))
    return results


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(rows: list[tuple[str, str]], results: dict[str, Outcome], notes: list[str]) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counts = {status: sum(r.status == status for r in results.values()) for status in (PASS, FAIL, SKIPPED)}
    parts = [f"# lightning_gaudi doctor report ({now})", "", "## Stack", "", "| | |", "|---|---|"]
    parts += [f"| {name} | {_cell(value)} |" for name, value in rows]
    parts += ["", "## Checks", "", f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped.", ""]
    parts += ["| check | result | measured | reason |", "|---|---|---|---|"]
    parts += [f"| {name} | {r.status} | {_cell(r.figure)} | {_cell(r.reason)} |" for name, r in results.items()]
    return "\n".join([*parts, "", *notes, ""])


def repository_tests(checkout: Path, gaudi: bool, timeout: float) -> tuple[int | str, str]:
    """The bridge tests (on a Gaudi) or the emulator's selection of the source checkout ``checkout``, with pytest, as
    a report section."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rfEs", "--no-header"]
    command = (
        [*pytest, "--real-bridge", "-m", "bridge"] if gaudi else [*pytest, "-m", "not subprocess", *EMULATOR_TESTS]
    )
    print(f"lightning_gaudi.doctor: {' '.join(command[2:])}", file=sys.stderr)
    try:
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s", ""
    tail = "\n".join((done.stdout + done.stderr).rstrip().splitlines()[-120:])
    what = "bridge tests on Intel's bridge" if gaudi else "the emulator's tests"
    heading = f"## Repository tests ({what})\n\n`{' '.join(command[2:])}`: exit status {done.returncode}"
    return done.returncode, f"{heading}\n\n```\n{tail}\n```\n"


class ReportFile:
    """The report at ``path``: created before anything runs, then rewritten whole each time a row completes (through a
    temporary file beside it, replaced in one step; in place where that fails), so the file always holds a report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[tuple[str, str]] = []
        self.results: dict[str, Outcome] = {}
        self.notes: list[str] = []
        self.running = True
        self._said = False

    def text(self) -> str:
        running = ["RUNNING: this report is rewritten as each check completes."] if self.running else []
        return report(self.rows, self.results, [*running, *self.notes])

    def create(self) -> str | None:
        """Writes the first version at ``path`` itself; why it cannot be written, or ``None``."""
        try:
            self.path.write_text(self.text())
        except OSError as error:
            return f"--out {str(self.path)!r} cannot be written: {error.strerror or error}. Choose another path."
        return None

    def add(self, name: str, outcome: Outcome) -> None:
        self.results[name] = outcome
        self.write()

    def _replace(self, text: str) -> None:
        target = Path(os.path.realpath(self.path))  # a link keeps pointing where it pointed
        descriptor, partial = tempfile.mkstemp(prefix=".doctor-", suffix=".partial", dir=target.parent)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
            os.chmod(partial, target.stat().st_mode & 0o777)  # the mode it was created with (the umask's)
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    def write(self) -> bool:
        """Rewrites the file; ``False`` (said once on stderr) when it could not be written."""
        text = self.text()
        try:
            self._replace(text)
        except OSError:
            try:
                self.path.write_text(text)
            except OSError as error:
                if not self._said:
                    print(f"lightning_gaudi.doctor: could not write {self.path}: {error}", file=sys.stderr)
                self._said = True
                return False
        return True


def run(args: argparse.Namespace) -> int:
    """Runs the doctor with arguments that :mod:`.options` accepted; returns the exit status."""
    try:
        emulated = runtime.emulation_mode() is not None
    except ValueError as error:
        print(f"lightning_gaudi.doctor: {error}", file=sys.stderr)
        return 2
    out = ReportFile(args.out)
    problem = out.create()
    if problem:
        print(f"lightning_gaudi.doctor: {problem}", file=sys.stderr)
        return 2
    status = 1
    try:
        print("lightning_gaudi.doctor: reading the stack", file=sys.stderr)
        out.rows = stack(os.environ)
        out.write()
        if not emulated and not runtime.bridge_installed():
            out.notes.append(
                "NOTHING COULD RUN: Intel's bridge (habana_frameworks.torch) is not installed and emulation is off."
                f" On a Gaudi, run the doctor inside Intel's Gaudi PyTorch environment; to check the emulator, set"
                f" {runtime.EMULATE_ENV}=eager."
            )
        else:
            with tempfile.TemporaryDirectory(prefix="lightning_gaudi_doctor_") as work:
                out.results = run_checks(os.environ, args.timeout, args.only, Path(work), out.add)
        results = out.results
        status = 1 if not results or any(r.status == FAIL for r in results.values()) else 0
        if args.tests is not None:
            code, section = repository_tests(
                args.tests, gaudi=not emulated and runtime.bridge_installed(), timeout=args.timeout * 6
            )
            out.notes.append(section)
            status = status or int(code != 0)
    except BaseException as error:
        why = type(error).__name__ + (f": {error}" if str(error) else "")
        out.notes.append(f"INCOMPLETE: the run stopped ({why}) before it finished.")
        raise
    finally:
        out.running = False
        written = out.write()
        if not written:  # the folder went away or filled up: the report still reaches the user
            print(out.text())
            print(f"lightning_gaudi.doctor: the report above could not be written to {args.out}", file=sys.stderr)
    if not written:
        return status or 1
    print(f"lightning_gaudi.doctor: wrote {args.out.resolve()}: attach it to your issue", file=sys.stderr)
    return status
