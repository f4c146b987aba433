"""What works on this machine, as one report to attach to an issue: ``python -m lightning_gaudi.doctor [--out FILE]``.

The stack, then the built-in checks, each in a worker process stopped when it overruns ``--timeout``; docs/compat.md
("The doctor") lists them. The report file is created before anything runs and rewritten as each row completes. The
exit status is 0 when every check passed or was skipped, 1 when one failed, nothing could run or the finished report
could not be written (it is then printed), 2 on bad arguments or an ``--out`` that cannot be created.

This module imports neither torch nor Lightning: the arguments are checked first (:mod:`.options`), then
:mod:`.runner` runs the checks.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_gaudi.doctor.options import parse, refuse

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Writes the report; returns the exit status (see the module docstring)."""
    args, problems = parse(argv)
    if problems:
        refuse(problems)
        return 2
    from lightning_gaudi.doctor import runner

    return runner.run(args)
