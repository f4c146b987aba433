"""The README is true: its two set-up commands, every command it shows, every name and link it mentions exist."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest
import tomllib
from helpers.configs import compose_train
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gaudi
import lightning_gaudi.app.hydra
from lightning_gaudi import callbacks

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
COMMANDS = [line.split("#")[0].strip() for kind, body in BLOCKS if kind == "bash" for line in body.splitlines()]


def test_the_first_two_commands_set_up_and_run_the_main_job_and_the_tests() -> None:
    first, second = COMMANDS[:2]
    assert first == "scripts/setup.sh && .venv/bin/python examples/train.py"
    assert second == "scripts/setup.sh && .venv/bin/python -m pytest -q"
    assert (ROOT / "scripts/setup.sh").is_file()
    assert (ROOT / ".ci/run").read_text().count("scripts/setup.sh && .venv/bin/python -m pytest -q") == 1


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("python examples/train.py")])
def test_every_hydra_command_composes(command: str) -> None:
    """Each override names an existing config group option and key (Hydra refuses the others)."""
    overrides = shlex.split(command)[2:]
    assert compose_train(overrides) is not None


def test_every_command_runs_an_existing_script() -> None:
    scripts = pyproject_scripts()
    for command in COMMANDS:
        program, *args = shlex.split(command)
        if program == "python":
            assert (ROOT / args[0]).is_file(), command
        elif program == "lightning-gaudi":
            assert program in scripts, command
        elif program == "pip":
            assert args[0] == "install", command  # what it installs: tests/test_install_docs.py
        elif program != "scripts/setup.sh":
            pytest.fail(f"the README runs {program!r}: add a check for it here")


def pyproject_scripts() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def test_every_python_name_resolves() -> None:
    for kind, body in BLOCKS:
        if kind != "python":
            continue
        tree = ast.parse(body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_gaudi"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "lightning_gaudi":
                assert hasattr(lightning_gaudi, node.attr), f"lightning_gaudi.{node.attr}"


#: Capitalized names in the README that are not callbacks of lightning_gaudi.callbacks.
NOT_CALLBACKS = {"ModelParallelStrategy"}


def test_every_strategy_callback_and_name_in_backticks_exists() -> None:
    names = set(re.findall(r"`([A-Za-z_][\w.]*)`", README))
    for name in names:
        if name.startswith("hpu_"):
            assert name in StrategyRegistry or name.startswith("hpu_deepspeed_stage_1/"), name
        elif name[0].isupper() and name.isidentifier() and name not in NOT_CALLBACKS:
            assert hasattr(callbacks, name), name
        elif name.startswith("lightning_gaudi."):
            module, _, attribute = name.rpartition(".")
            assert hasattr(importlib.import_module(module), attribute), name
    for name in ("HPUCompile", "HPUGraphs", "PreemptionCheckpoint"):
        assert f"`{name}`" in README
        assert hasattr(callbacks, name)
    for stage in (1, 2, 3):
        assert f"hpu_deepspeed_stage_{stage}" in StrategyRegistry


def test_every_link_exists() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target
