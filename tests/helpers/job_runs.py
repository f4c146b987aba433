"""Jobs that train several times in the same rank processes (each Lightning-importing process costs seconds of CPU to
start): rank 0 marks in stderr where each run's lines start, and the tests cut the job's stderr there."""

from __future__ import annotations

import sys

from lightning.pytorch.utilities import rank_zero_only

RUN_MARKER = "lightning_gaudi tests: run "


@rank_zero_only
def announce_run(name: str) -> None:
    """On rank 0, the stderr line that starts the run ``name``."""
    print(f"{RUN_MARKER}{name}", file=sys.stderr, flush=True)


def stderr_by_run(stderr: str) -> dict[str, str]:
    """A job's stderr cut at its runs' marker lines: each run's lines after its marker, by run name, in order."""
    runs: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(RUN_MARKER):
            name = line.removeprefix(RUN_MARKER)
            if name in runs:
                raise ValueError(f"the run {name!r} was announced twice in one job")
            lines = runs[name] = []
        else:
            lines.append(line)
    return {name: "\n".join(lines) for name, lines in runs.items()}
