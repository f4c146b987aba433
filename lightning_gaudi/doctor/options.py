"""The doctor's command line, read and checked without importing torch or Lightning.

``python -m lightning_gaudi.doctor`` imports the parent package first, which loads torch and Lightning (seconds);
under that command ``lightning_gaudi/__init__.py`` calls :func:`answer_early` before those imports, so ``--help`` and
bad arguments are answered in a fraction of a second. :func:`lightning_gaudi.doctor.main` checks them again (the same
code) and then checks what needs torch (``LIGHTNING_GAUDI_EMULATE``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: The module that ``python -m`` runs for the doctor.
MODULE = "lightning_gaudi.doctor"
#: The in-process checks, in the report's order (:data:`lightning_gaudi.doctor.checks.CHECKS` has these keys).
CHECK_NAMES = (
    "device",
    "memory_stats",
    "bf16 autocast",
    "FusedSDPA",
    "FusedRMSNorm",
    "RoPE",
    "fused AdamW",
    "fused clip norm",
    "FP8",
    "throughput, eager mode",
    "throughput, compile mode",
    "mark_step",
    "HPU graphs",
    "throughput, lazy mode",
)
#: The multi-process checks, by the start of their names (``fit, hpu_parallel``, ...).
MULTI_PROCESS_CHECKS = ("all-reduce", "fit")
DESCRIPTION = "What works on this machine, as one report to attach to an issue."


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=DESCRIPTION)
    parser.add_argument("--out", type=Path, default=Path("lightning_gaudi_doctor.md"), help="the report to write")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each check may take (default 600)")
    parser.add_argument("--only", action="append", metavar="CHECK", help="run this check only (repeatable)")
    parser.add_argument(
        "--tests", type=Path, metavar="CHECKOUT", help="also run the tests of this lightning_gaudi source checkout"
    )
    return parser


def check_out(path: Path) -> str | None:
    """Why the report cannot be written to ``path`` (checked before anything runs), or ``None``."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            return f"--out {str(path)!r}: the folder {str(parent)!r} does not exist. Create it or choose another path."
        if path.is_dir():
            return f"--out {str(path)!r} is a folder; give a file name, e.g. {str(path / 'doctor.md')!r}."
        if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            return f"--out {str(path)!r} is not writable here. Choose a path you can write to."
    except OSError as error:  # a name too long for the file system, a link loop, ...
        return f"--out {str(path)!r} cannot be used: {error.strerror or error}. Choose another path."
    return None


def problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the parsed arguments, one sentence each."""
    found = [problem for problem in [check_out(args.out)] if problem]
    if args.timeout <= 0:
        found.append(f"--timeout {args.timeout:g} must be a positive number of seconds.")
    if args.tests is not None and not (args.tests / "tests" / "conftest.py").is_file():
        found.append(
            f"--tests {str(args.tests)!r} is not a lightning_gaudi source checkout (no tests/conftest.py there). Give"
            " the folder of a clone (`git clone` the project, `pip install -e '.[dev]'` there)."
        )
    known = [*CHECK_NAMES, *MULTI_PROCESS_CHECKS]
    unknown = [name for name in args.only or () if not name.startswith(tuple(known))]
    if unknown:
        found.append(f"--only {unknown}: no such check; the checks are {known}.")
    return found


def parse(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The arguments and their problems; argparse's own errors and ``--help`` exit (status 2 and 0)."""
    args = parser().parse_args(argv)
    return args, problems(args)


def refuse(found: list[str]) -> None:
    print("lightning_gaudi.doctor: " + "\n".join(found), file=sys.stderr)


def running_module(argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None) -> str | None:
    """The module that ``python -m MODULE`` is locating or importing now (``sys.argv[0]`` is ``"-m"`` until it
    runs), or ``None`` when the process was not started that way."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv
    if not argv or argv[0] != "-m" or len(orig_argv) < len(argv):
        return None
    token = orig_argv[len(orig_argv) - len(argv)]  # `-m MODULE ARGS...` or `-mMODULE ARGS...`
    return token[2:] if token.startswith("-m") and token != "-m" else token


def answer_early() -> None:
    """Under ``python -m lightning_gaudi.doctor``: prints the help (exit status 0) or refuses bad arguments (exit
    status 2) before torch and Lightning are imported; returns for good arguments and for any other command."""
    if running_module() != MODULE:
        return
    found = parse(sys.argv[1:])[1]
    if found:
        refuse(found)
        raise SystemExit(2)
