"""``python -m lightning_gaudi fabric run`` (``lightning_gaudi/fabric_run.py``): Lightning's ``fabric run`` for the HPU,
with the same options, checked before any process starts.

The end-to-end test runs Lightning's two Fabric examples (vendored in ``tests/programs``: the language model, and the
image classifier on offline stand-in data) on 2 emulated HPUs through the command, against Lightning's own
``fabric run --accelerator cpu --devices 2 --strategy ddp`` on 2 CPUs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.loopback_nodes import free_port
from lightning.fabric import cli as lightning_cli
from torch.distributed import run as torchrun

from lightning_gaudi import fabric_run, hpu
from lightning_gaudi.__main__ import parse as parse_program
from lightning_gaudi.fabric import RUN_COMMAND

PROGRAMS = Path(__file__).parent / "programs"
SCRIPT = str(PROGRAMS / "fabric_examples.py")
LT_NAMES = (*fabric_run.ENV.values(), fabric_run.CLI_USED_ENV, "OMP_NUM_THREADS")


def test_the_command_is_routed_and_lightnings_other_fabric_commands_are_not() -> None:
    assert parse_program(["fabric", "run", "--devices", "2", "x.py"]) == (
        ("fabric_run", "fabric run"),
        ["--devices", "2", "x.py"],
    )
    assert parse_program(["fabric", "consolidate", "ckpt/"]) == (("entry_point", "fabric"), ["consolidate", "ckpt/"])
    assert fabric_run.COMMAND == RUN_COMMAND == "python -m lightning_gaudi fabric run"


def test_options_as_lightnings_before_and_after_the_script() -> None:
    """As Lightning's click command: options anywhere, the rest (in order) to the script; underscore spellings too."""
    args, script_args = fabric_run.parse(
        [SCRIPT, "--accelerator=hpu", "--devices", "2", "--epochs", "3", "--num_nodes", "2", "--node-rank", "1", "x"]
    )
    assert (args.script, args.accelerator, args.devices, args.num_nodes, args.node_rank) == (SCRIPT, "hpu", "2", 2, 1)
    assert (args.main_address, args.main_port, args.strategy, args.precision) == ("127.0.0.1", 29400, None, None)
    assert script_args == ["--epochs", "3", "x"]


def test_the_strategies_are_the_hpu_ones_and_lightnings_that_fabric_run_starts() -> None:
    names = fabric_run.strategies()
    for name in ("hpu_single", "hpu_parallel", "hpu_fsdp", "hpu_model_parallel", "ddp", "fsdp", "deepspeed"):
        assert name in names
    assert not [name for name in names if re.search("spawn|fork|notebook|xla|offload", name)]
    # Lightning's `fabric run` offers the same names once the HPU's are registered
    assert set(lightning_cli._get_supported_strategies()) == set(names)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py"], "SCRIPT 'missing.py' is not a file"),
        ([SCRIPT, "--strategy", "hpu_paralel"], r"--strategy 'hpu_paralel' is not a strategy .*hpu_parallel"),
        ([SCRIPT, "--strategy", "ddp_spawn"], "--strategy 'ddp_spawn' is not a strategy"),
        ([SCRIPT, "--num-nodes", "0"], "--num-nodes must be 1 or more"),
        ([SCRIPT, "--num-nodes", "2", "--node-rank", "2"], r"--node-rank must be in 0 ... 1"),
        ([SCRIPT, "--main-port", "70000"], "--main-port must be a TCP port"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(fabric_run.LaunchError, match=message):
        fabric_run.parse(argv)


def test_an_accelerator_it_cannot_start_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fabric_run.parse([SCRIPT, "--accelerator", "gpu"])
    assert "invalid choice: 'gpu' (choose from 'hpu', 'cpu', 'auto')" in capsys.readouterr().err


def test_help_shows_lightnings_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        fabric_run.parse(["--help"])
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: {RUN_COMMAND} [OPTIONS] SCRIPT [SCRIPT_ARGS...]")
    for option in (
        "--accelerator",
        "--strategy",
        "--devices",
        "--num-nodes",
        "--node-rank",
        "--main-address",
        "--main-port",
        "--precision",
    ):
        assert option in shown


def _checked(argv: list[str]) -> int:
    return fabric_run.check(fabric_run.parse([SCRIPT, *argv])[0])


def test_the_ranks_fabric_is_built_first(eager_hpu: hpu.Backend) -> None:
    assert _checked(["--accelerator", "hpu", "--devices", "2"]) == 2
    assert _checked(["--devices", "4", "--strategy", "hpu_fsdp", "--precision", "bf16-mixed"]) == 4  # HPU by default
    assert _checked(["--devices", "0,1,2", "--strategy", "ddp", "--num-nodes", "2"]) == 3
    assert _checked(["--devices", "auto"]) == 8  # every card of the node
    assert _checked(["--devices", "1"]) == 1
    assert _checked(["--accelerator", "cpu", "--devices", "2"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "9"], "cannot start: .*9"),
        (["--devices", "2", "--precision", "64-true"], "cannot start: .*64-true"),
        (["--devices", "2", "--precision", "bf17"], "cannot start: Precision 'bf17' is invalid"),
        (["--devices", "2", "--strategy", "deepspeed"], "cannot start: .*DeepSpeed"),
    ],
)
def test_what_the_hpu_cannot_run_is_refused_before_any_process(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(torchrun, "main", started.append)
    with pytest.raises(fabric_run.LaunchError, match=message):
        _checked(argv)
    with pytest.raises(SystemExit, match=f"error: `{re.escape(RUN_COMMAND)}"):
        fabric_run.main([SCRIPT, *argv])
    assert started == []


def test_the_ranks_get_lightnings_variables() -> None:
    """Canary: the variables are the ones Lightning's `fabric run` sets (and the connector reads) for each option."""
    args, _ = fabric_run.parse(
        [SCRIPT, "--accelerator", "hpu", "--strategy", "ddp", "--devices", "2", "--precision", "bf16-mixed"]
    )
    expected = fabric_run.environment(args)
    saved = {name: os.environ.get(name) for name in LT_NAMES}
    try:
        lightning_cli._set_env_variables(argparse.Namespace(**vars(args)))
        assert {name: os.environ[name] for name in expected} == expected
        assert expected == {
            "LT_CLI_USED": "1",
            "LT_ACCELERATOR": "hpu",
            "LT_STRATEGY": "ddp",
            "LT_DEVICES": "2",
            "LT_NUM_NODES": "1",
            "LT_PRECISION": "bf16-mixed",
        }
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    source = inspect.getsource(lightning_cli._set_env_variables)
    assert set(re.findall(r"LT_[A-Z_]+", source)) == set(expected), "Lightning's `fabric run` sets other variables now"


def test_each_node_starts_its_ranks_through_lightning_gaudi(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in LT_NAMES:  # main() sets them for the ranks: put back what was there
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    started: list[list[str]] = []
    monkeypatch.setattr(torchrun, "main", started.append)
    argv = [
        "--devices",
        "2",
        "--num-nodes",
        "2",
        "--node-rank",
        "1",
        "--main-address",
        "10.0.0.1",
        "--main-port",
        "1234",
    ]
    fabric_run.main([*argv, SCRIPT, "--epochs", "3"])
    (arguments,) = started
    parsed = torchrun.parse_args(arguments)
    assert (parsed.nproc_per_node, parsed.nnodes, parsed.node_rank) == ("2", "2", 1)
    assert (parsed.master_addr, parsed.master_port) == ("10.0.0.1", 1234)
    assert (parsed.module, parsed.training_script, parsed.training_script_args) == (
        True,
        "lightning_gaudi",
        [SCRIPT, "--epochs", "3"],
    )
    assert os.environ["LT_CLI_USED"] == "1"
    assert os.environ["LT_DEVICES"] == "2"
    assert os.environ["LT_NUM_NODES"] == "2"
    assert "LT_ACCELERATOR" not in os.environ  # as Lightning's: Fabric's "auto", the HPU with lightning_gaudi


# ----------------------------------------------------------------------------------------------------------------------
# Lightning's examples: 2 emulated HPUs through the command against Lightning's `fabric run` on 2 CPUs
# ----------------------------------------------------------------------------------------------------------------------

NUMBER = re.compile(r"-?\d+\.\d+")


def _words(workdir: Path) -> None:
    """``data/wikitext-2.txt`` for WikiText2 (which downloads only a missing file): about 3850 words of local text,
    about 110 samples: the language model's 2 training batches per rank (its 20-sample splits aside)."""
    lines: list[str] = []
    for line in inspect.getsource(argparse).splitlines():
        if line.split():
            lines.append(" ".join(line.split()))
        if sum(len(kept.split()) + 1 for kept in lines) > 3850:
            break
    (workdir / "data").mkdir(parents=True)
    (workdir / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")


def _run(tmp_path: Path, name: str, command: list[str], env: dict[str, str]) -> dict[int, tuple[list[str], list[Any]]]:
    workdir = tmp_path / name
    _words(workdir)
    (workdir / "out").mkdir()
    port = ["--main-port", str(free_port())]
    proc = subprocess.Popen(
        [*command, *port, SCRIPT, str(workdir / "out")],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the launcher and its ranks, ended together if they hang
    )
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"{name}: no end after 240 s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    ranks = {}
    for rank in range(2):
        lines = (workdir / "out" / f"rank{rank}.txt").read_text().splitlines()
        built = [json.loads(line) for line in lines if line.startswith("{")]
        ranks[rank] = ([line for line in lines if line and not line.startswith("{")], built)
    return ranks


@pytest.mark.subprocess
def test_lightnings_fabric_examples_on_2_hpus_equal_2_cpus(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "LT_", "TORCHELASTIC_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"):
        env.pop(name, None)
    fabric = Path(sys.executable).parent / "fabric"  # Lightning's console script
    cpu = _run(
        tmp_path, "cpu", [str(fabric), "run", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"], env
    )
    env = {**env, hpu.EMULATE_ENV: "eager", hpu.DEVICES_ENV: "2"}
    command = [sys.executable, "-m", "lightning_gaudi", "fabric", "run", "--accelerator", "hpu", "--devices", "2"]
    hpu_run = _run(tmp_path, "hpu", [*command, "--strategy", "ddp"], env)
    for rank in range(2):
        (cpu_lines, cpu_built), (hpu_lines, hpu_built) = cpu[rank], hpu_run[rank]
        # both examples built Fabric(): on the CPU's classes there, on the HPU's here, lightning_gaudi imported by the
        # command (the examples never import it)
        assert (
            cpu_built
            == [
                {
                    "accelerator": "CPUAccelerator",
                    "strategy": "DDPStrategy",
                    "precision": "Precision",
                    "lightning_gaudi": False,
                }
            ]
            * 2
        )
        assert (
            hpu_built
            == [
                {
                    "accelerator": "HPUAccelerator",
                    "strategy": "HPUParallelStrategy",
                    "precision": "Precision",
                    "lightning_gaudi": True,
                }
            ]
            * 2
        )
        assert [NUMBER.sub("#", line) for line in hpu_lines] == [NUMBER.sub("#", line) for line in cpu_lines]
        cpu_numbers = [float(n) for line in cpu_lines for n in NUMBER.findall(line)]
        hpu_numbers = [float(n) for line in hpu_lines for n in NUMBER.findall(line)]
        assert len(cpu_numbers) >= 10  # the classifier: 8 losses, 2 test losses (rank 0: the language model 2 more)
        assert hpu_numbers == pytest.approx(cpu_numbers, rel=1e-4, abs=1e-4), "\n".join(hpu_lines)
