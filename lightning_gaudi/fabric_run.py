"""``python -m lightning_gaudi fabric run [OPTIONS] SCRIPT [ARGS...]``: Lightning's ``fabric run`` on the HPU.

Lightning's ``fabric run`` cannot start HPU jobs: its ``--accelerator`` choices lack ``hpu``, it never imports
``lightning_gaudi``, and its ranks run ``python SCRIPT``. This command takes the same options, checks them by building
the ranks' Fabric before any process starts, and runs each rank as ``python -m lightning_gaudi SCRIPT ARGS``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from lightning.fabric import Fabric
from lightning.fabric.strategies import STRATEGY_REGISTRY, ParallelStrategy
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.distributed import run as torchrun

import lightning_gaudi  # noqa: F401  # registers the HPU and its strategies before the options are checked
from lightning_gaudi.fabric import RUN_COMMAND

#: The command, as users type it (Fabric's refusal of an unlaunched multi-device job on the HPU names it).
COMMAND = RUN_COMMAND
#: The variables Lightning's ``fabric run`` sets for the script's ``Fabric()`` (``lightning.fabric.cli``), by option.
ENV = {
    "accelerator": "LT_ACCELERATOR",
    "strategy": "LT_STRATEGY",
    "devices": "LT_DEVICES",
    "num_nodes": "LT_NUM_NODES",
    "precision": "LT_PRECISION",
}
CLI_USED_ENV = "LT_CLI_USED"


class LaunchError(ValueError):
    """The options cannot start a job; raised before any process starts, with what to change."""


def strategies() -> list[str]:
    """The strategy names ``--strategy`` takes: Fabric's registry (the HPU's included) less the ones Lightning's
    ``fabric run`` leaves out (they start processes themselves or need more configuration)."""
    excluded = re.compile(r".*(spawn|fork|notebook|xla|tpu|offload).*")
    return [name for name in STRATEGY_REGISTRY.available_strategies() if not excluded.match(name)]


def parser() -> argparse.ArgumentParser:
    """The options of Lightning's ``fabric run``, with ``hpu`` among the accelerators."""
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        usage=f"{COMMAND} [OPTIONS] SCRIPT [SCRIPT_ARGS...]",
        description="Runs a Lightning Fabric script (without `fabric.launch()`) on HPUs, one process per device."
        " Options this command does not know, and what follows SCRIPT, go to SCRIPT.",
        allow_abbrev=False,
    )
    parser.add_argument("script", metavar="SCRIPT", help="the Python script to run; it must build a Fabric object")
    parser.add_argument("--accelerator", choices=("hpu", "cpu", "auto"), help="the hardware (default: the HPU)")
    parser.add_argument("--strategy", help="hpu_parallel (the default on several devices), hpu_fsdp, ddp, ...")
    parser.add_argument(
        "--devices", default="1", help="the number of devices per node, their indices ('0,1'), or 'auto' (every card)"
    )
    parser.add_argument("--num-nodes", "--num_nodes", type=int, default=1, help="the number of machines (nodes)")
    parser.add_argument(
        "--node-rank", "--node_rank", type=int, default=0, help="the index of this node, 0 ... num_nodes - 1"
    )
    parser.add_argument("--main-address", "--main_address", default="127.0.0.1", help="the node of node rank 0")
    parser.add_argument(
        "--main-port", "--main_port", type=int, default=29400, help="the port on the main node to connect to"
    )
    parser.add_argument("--precision", help="32-true, bf16-mixed, bf16-true, 16-mixed, fp8, ...")
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(options, script_args)`` from the command's arguments (options may follow SCRIPT, as Lightning's);
    :class:`LaunchError` for a SCRIPT that is no file, an unknown strategy or a bad node layout."""
    args, script_args = parser().parse_known_args(argv)
    if not Path(args.script).is_file():
        raise LaunchError(f"SCRIPT {args.script!r} is not a file. Pass the path of the Python script to run.")
    if args.strategy is not None and args.strategy not in (known := strategies()):
        raise LaunchError(
            f"--strategy {args.strategy!r} is not a strategy `{COMMAND}` can start. Choose one of: {', '.join(known)}."
        )
    if args.num_nodes < 1:
        raise LaunchError(f"--num-nodes must be 1 or more, got {args.num_nodes}.")
    if not 0 <= args.node_rank < args.num_nodes:
        raise LaunchError(
            f"--node-rank must be in 0 ... {args.num_nodes - 1} (--num-nodes {args.num_nodes}), got {args.node_rank}."
        )
    if not 0 < args.main_port < 65536:
        raise LaunchError(f"--main-port must be a TCP port (1 ... 65535), got {args.main_port}.")
    return args, script_args


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The variables the ranks' ``Fabric()`` reads (Lightning's names and rules: unset options are left out)."""
    return {
        CLI_USED_ENV: "1",
        **{name: str(v) for option, name in ENV.items() if (v := getattr(args, option)) is not None},
    }


def check(args: argparse.Namespace) -> int:
    """Builds the ranks' Fabric here and returns the number of processes to start on this node; raises
    :class:`LaunchError` with Fabric's reason when it cannot be built."""
    options = ("accelerator", "strategy", "devices", "num_nodes", "precision")
    settings: dict[str, Any] = {name: value for name in options if (value := getattr(args, name)) is not None}
    try:
        fabric = Fabric(**settings)
    except (ValueError, TypeError, RuntimeError, MisconfigurationException) as error:
        shown = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in settings.items())
        raise LaunchError(f"`{COMMAND} {shown}` cannot start: {error}") from error
    strategy = fabric.strategy
    return len(strategy.parallel_devices or ()) if isinstance(strategy, ParallelStrategy) else 1


def main(argv: list[str]) -> None:
    """Checks the options, then starts the ranks with torchrun (in this process, as Lightning's ``fabric run``)."""
    try:
        args, script_args = parse(argv)
        processes = check(args)
    except LaunchError as error:
        raise SystemExit(f"error: {error}") from None
    os.environ.update(environment(args))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpus // processes)))  # as Lightning's `fabric run`
    # each rank runs `python -m lightning_gaudi SCRIPT ARGS`
    address = [f"--master-addr={args.main_address}", f"--master-port={args.main_port}"]
    nodes = [f"--nproc-per-node={processes}", f"--nnodes={args.num_nodes}", f"--node-rank={args.node_rank}"]
    torchrun.main([*nodes, *address, "--module", "lightning_gaudi", args.script, *script_args])
