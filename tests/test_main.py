"""``python -m lightning_gaudi PROGRAM [ARGS...]`` (``lightning_gaudi/__main__.py``): a program that never imports
``lightning_gaudi`` trains on the (emulated) HPU, on several devices too, with its own arguments, exit code and
signal handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_gaudi import hpu
from lightning_gaudi.__main__ import ProgramError, parse

PROGRAMS = Path(__file__).parent / "programs"


def test_parse_tells_console_scripts_files_and_modules_apart(tmp_path: Path) -> None:
    assert parse(["lightning-gaudi", "fit", "--x"]) == (("entry_point", "lightning-gaudi"), ["fit", "--x"])
    script = PROGRAMS / "gpu_script.py"
    assert parse([str(script), "2"]) == (("script", str(script.resolve())), ["2"])
    assert parse(["-m", "my.module", "--lr", "1"]) == (("module", "my.module"), ["--lr", "1"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "usage: python -m lightning_gaudi PROGRAM"),
        (["-m"], "needs a module to run"),
        (["--devices", "2"], "Unknown option '--devices'"),
        (["no-such-tool-here"], "'no-such-tool-here' is neither a console script.*nor a program on PATH"),
    ],
)
def test_parse_refuses_what_it_cannot_run(argv: list[str], message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        parse(argv)


def test_parse_refuses_a_program_that_is_not_python(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ProgramError, match="is not a Python program"):
        parse([str(binary)])


def _env() -> dict[str, str]:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    env[hpu.DEVICES_ENV] = "2"
    return env


@pytest.mark.subprocess
@pytest.mark.parametrize(("how", "devices"), [("script", 2), ("module", 1)])
def test_a_gpu_script_trains_on_the_emulated_hpus_with_its_exit_code(tmp_path: Path, how: str, devices: int) -> None:
    program = [str(PROGRAMS / "gpu_script.py")] if how == "script" else ["-m", "programs.gpu_script"]
    command = [sys.executable, "-m", "lightning_gaudi", *program, str(devices), "3", str(tmp_path)]
    proc = subprocess.run(
        command, cwd=PROGRAMS.parent, env=_env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    strategy = "HPUParallelStrategy" if devices > 1 else "SingleHPUStrategy"
    for rank in range(devices):  # rank 1 was started again by Lightning, through `python -m lightning_gaudi`
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts == {
            "accelerator": "HPUAccelerator",
            "strategy": strategy,
            "argv": [str(devices), "3", str(tmp_path)],
        }


@pytest.mark.subprocess
def test_signals_reach_the_programs_own_handlers() -> None:
    command = [sys.executable, "-m", "lightning_gaudi", str(PROGRAMS / "waits_for_sigterm.py")]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 42
    assert "handled SIGTERM" in out
