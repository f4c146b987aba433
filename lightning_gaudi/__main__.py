"""``python -m lightning_gaudi PROGRAM [ARGS...]`` (:data:`USAGE`): registers the HPU, then runs PROGRAM in this
process; the rank processes Lightning starts re-run this module and find PROGRAM in :data:`PROGRAM_ENV`."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from importlib.machinery import ModuleSpec
from importlib.metadata import entry_points
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

#: What this process runs, for the rank processes Lightning starts again as ``python -m lightning_gaudi ARGS``.
PROGRAM_ENV = "LIGHTNING_GAUDI_PROGRAM"

USAGE = """usage: python -m lightning_gaudi PROGRAM [ARGS...]
       python -m lightning_gaudi -m MODULE [ARGS...]
       python -m lightning_gaudi fabric run [OPTIONS] SCRIPT [ARGS...]

Registers the Intel Gaudi HPU with Lightning, then runs PROGRAM (a console script such as `litgpt`, or a Python file)
or MODULE with ARGS, so a tool that builds its own Trainer or Fabric trains on the HPU; `fabric run` is Lightning's
`fabric run` for the HPU. Examples:

  python -m lightning_gaudi litgpt pretrain pythia-14m --devices 2 ...
  python -m lightning_gaudi train.py --max_epochs 3
  python -m lightning_gaudi -m my_package.train --lr 1e-3
  python -m lightning_gaudi fabric run --accelerator hpu --devices 8 train.py
"""


class ProgramError(Exception):
    """PROGRAM is missing or cannot be found; the message says what to pass."""


def parse(argv: list[str]) -> tuple[tuple[str, str], list[str]]:
    """``(kind, target), args`` from the arguments (``kind``: ``"module"``, ``"entry_point"``, ``"script"`` or
    ``"fabric_run"``); :class:`ProgramError` when PROGRAM is missing or not found."""
    if not argv or argv[0] in ("-h", "--help"):
        raise ProgramError(USAGE)
    if argv[:2] == ["fabric", "run"]:  # Lightning's other `fabric` commands run as they are (a console script)
        return ("fabric_run", "fabric run"), argv[2:]
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ProgramError("`python -m lightning_gaudi -m` needs a module to run: -m MODULE [ARGS...].")
        return ("module", argv[1]), argv[2:]
    program, args = argv[0], argv[1:]
    if program.startswith("-"):
        raise ProgramError(f"Unknown option {program!r}.\n\n{USAGE}")
    if os.sep not in program and any(ep.name == program for ep in entry_points(group="console_scripts")):
        return ("entry_point", program), args
    found = program if Path(program).is_file() else shutil.which(program)
    if found is None:
        raise ProgramError(
            f"PROGRAM {program!r} is neither a console script of an installed package, nor a file, nor a program on"
            " PATH. Pass a console script (e.g. `litgpt`), the path of a Python file, or `-m MODULE`."
        )
    path = Path(found)
    if not _is_python(path):
        raise ProgramError(
            f"{str(path)!r} is not a Python program: `python -m lightning_gaudi` runs Python code in its own process."
            " Run a Python tool, or call `import lightning_gaudi` in the program itself."
        )
    return ("script", str(path.resolve())), args


def _is_python(path: Path) -> bool:
    with path.open("rb") as file:
        first = file.readline(200)
    return path.suffix == ".py" or (first.startswith(b"#!") and b"python" in first)


def _exec_as_main(code: CodeType, path: str) -> None:
    # as `python path` runs code, but with this module's `__spec__`: Lightning starts the rank processes as
    # `python -m <__main__.__spec__.name> ARGS`, which must come back here
    main = ModuleType("__main__")
    main.__file__ = path
    main.__spec__ = ModuleSpec(__spec__.name if __spec__ is not None else "lightning_gaudi", None)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved


def run(kind: str, target: str, args: list[str]) -> Any:
    """Runs the program ``(kind, target)`` with ``args`` as its ``sys.argv[1:]``; returns what an entry point returns.
    Raises :class:`ProgramError` when the module cannot be found."""
    if kind == "fabric_run":
        from lightning_gaudi import fabric_run

        # the ranks it starts find SCRIPT in their own arguments (`python -m lightning_gaudi SCRIPT ARGS`)
        os.environ.pop(PROGRAM_ENV, None)
        fabric_run.main(args)
        return None
    if kind == "entry_point":
        (entry,) = (ep for ep in entry_points(group="console_scripts") if ep.name == target)
        sys.argv = [shutil.which(target) or target, *args]
        return entry.load()()
    if kind == "module":
        spec = importlib.util.find_spec(target)
        if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
            spec = importlib.util.find_spec(f"{target}.__main__")
        loader: Any = spec.loader if spec is not None else None
        code = loader.get_code(spec.name) if spec is not None and loader is not None else None
        if spec is None or code is None:
            raise ProgramError(f"No module named {target!r} to run: check `-m {target}` and the environment.")
        sys.argv = [spec.origin or target, *args]
        _exec_as_main(code, spec.origin or target)
        return None
    sys.argv = [target, *args]
    sys.path[0] = str(Path(target).parent)  # where `python target` looks first
    _exec_as_main(compile(Path(target).read_bytes(), target, "exec"), target)
    return None


def _program(argv: list[str]) -> tuple[tuple[str, str], list[str]]:
    inherited = os.environ.get(PROGRAM_ENV)
    if inherited:
        recorded = json.loads(inherited)
        if recorded.get("parent") == os.getppid():  # a rank process its parent started again: argv are PROGRAM's
            return (recorded["kind"], recorded["target"]), argv
    (kind, target), args = parse(argv)
    os.environ[PROGRAM_ENV] = json.dumps({"kind": kind, "target": target, "parent": os.getpid()})
    return (kind, target), args


def main() -> None:
    try:
        (kind, target), args = _program(sys.argv[1:])
    except ProgramError as error:
        print(error, file=sys.stderr)
        raise SystemExit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2) from None
    import lightning_gaudi  # noqa: F401  # registers the HPU with the Trainer and Fabric

    result = run(kind, target, args)
    if result is not None:
        sys.exit(result)


if __name__ == "__main__":
    main()
