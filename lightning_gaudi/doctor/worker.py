"""``python -m lightning_gaudi.doctor.worker MODE CHECK...``: runs the named checks of :mod:`.checks` and reports each
on stdout as a line ``<MARK>{json}``: ``{"start": name}`` before it runs, then its outcome."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping

from lightning_gaudi.hpu import runtime

#: What starts each line meant for the runner (the rest of stdout is the checks' own chatter).
MARK = "@lightning_gaudi.doctor@ "


def mode_environment(environ: Mapping[str, str], mode: str) -> dict[str, str]:
    """``environ`` changed to run ``mode`` (``eager``, ``compile``, ``lazy``): on the emulator when it is in use."""
    env = dict(environ)
    env.pop(runtime.COMPILE_ENV, None)
    if runtime.emulation_mode(env) is not None:
        env[runtime.EMULATE_ENV] = "lazy" if mode == "lazy" else "eager"
    else:
        env[runtime.LAZY_MODE_ENV] = "1" if mode == "lazy" else "0"
    if mode == "compile":
        env[runtime.COMPILE_ENV] = "1"
    return env


def _emit(message: dict[str, object]) -> None:
    print(MARK + json.dumps(message), flush=True)


def main(argv: list[str]) -> int:
    from lightning_gaudi import hpu
    from lightning_gaudi.doctor.checks import CHECKS, FAIL, Outcome, failure

    names = argv[1:]
    try:
        backend = hpu.get_backend()
    except Exception as error:  # no device: every check says why
        for name in names:
            _emit({"name": name, **dataclasses.asdict(Outcome(FAIL, f"no HPU: {error}"))})
        return 1
    for name in names:
        _emit({"start": name})
        try:
            outcome = CHECKS[name][1](backend)
        except Exception as error:
            outcome = failure(backend, error)
        _emit({"name": name, **dataclasses.asdict(outcome)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
