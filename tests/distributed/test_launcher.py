"""The local rank launcher: each rank's environment, refusals before anything starts, and stopping the rest."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lightning_gaudi.distributed
from lightning_gaudi.distributed import InvalidLaunchError, free_port, launch_local_ranks, wait_all

DISTRIBUTED = Path(lightning_gaudi.distributed.__file__).parent

_NAMES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "LOCAL_RANK", "KEEP")
_DUMP = (
    "import json, os, sys; from pathlib import Path; rank = os.environ['LOCAL_RANK'];"
    f" Path(sys.argv[1], rank + '.json').write_text(json.dumps({{n: os.environ.get(n) for n in {_NAMES!r}}}))"
)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "KEEP": "kept", **extra}


def _seen(out: Path, nprocs: int) -> list[dict[str, str | None]]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(nprocs)]


@pytest.mark.subprocess
def test_each_rank_gets_its_place(tmp_path: Path) -> None:
    codes = launch_local_ranks([sys.executable, "-c", _DUMP, str(tmp_path)], nprocs=3, env=_env())
    assert codes == [0, 0, 0]
    seen = _seen(tmp_path, 3)
    port = seen[0]["MASTER_PORT"]
    assert port is not None
    assert 1 <= int(port) <= 65535
    for rank, env in enumerate(seen):
        assert env == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "NODE_RANK": "0",
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "KEEP": "kept",
        }


@pytest.mark.subprocess
def test_a_multi_node_launch_keeps_the_nodes_settings(tmp_path: Path) -> None:
    env = _env(MASTER_ADDR="10.0.0.1", MASTER_PORT="29555", NODE_RANK="1")
    assert launch_local_ranks([sys.executable, "-c", _DUMP, str(tmp_path)], 2, num_nodes=2, env=env) == [0, 0]
    seen = _seen(tmp_path, 2)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["NODE_RANK"], e["WORLD_SIZE"]) for e in seen} == {
        ("10.0.0.1", "29555", "1", "4")
    }


def test_multi_node_needs_the_address_of_rank_zero(tmp_path: Path) -> None:
    with pytest.raises(InvalidLaunchError, match=r"num_nodes=2 without a cluster launcher: set MASTER_ADDR, MASTER"):
        launch_local_ranks([sys.executable, "-c", _DUMP, str(tmp_path)], 2, num_nodes=2, env=_env(NODE_RANK="1"))
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize(
    ("extra", "nprocs", "num_nodes", "message"),
    [
        ({"MASTER_PORT": "99999"}, 2, 1, r"MASTER_PORT='99999' is not a TCP port"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "29555", "NODE_RANK": "2"}, 2, 2, r"NODE_RANK=2 is out of range"),
        ({}, 0, 1, r"nprocs=0 and num_nodes=1 must both be at least 1"),
    ],
)
def test_bad_launches_fail_before_anything_starts(
    tmp_path: Path, extra: dict[str, str], nprocs: int, num_nodes: int, message: str
) -> None:
    with pytest.raises(InvalidLaunchError, match=message):
        launch_local_ranks([sys.executable, "-c", _DUMP, str(tmp_path)], nprocs, num_nodes, env=_env(**extra))
    assert not list(tmp_path.iterdir())


@pytest.mark.subprocess
def test_a_failing_rank_stops_the_others() -> None:
    script = "import os, sys, time; rank = int(os.environ['LOCAL_RANK']); sys.exit(3) if rank == 0 else time.sleep(60)"
    started = time.monotonic()
    codes = launch_local_ranks([sys.executable, "-c", script], nprocs=2, env=_env())
    assert codes[0] == 3
    assert codes[1] != 0
    assert time.monotonic() - started < 30


@pytest.mark.subprocess
def test_wait_all_stops_the_other_ranks_when_one_fails() -> None:
    start = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
    ]
    codes = wait_all(procs)
    assert codes[0] == 3
    assert codes[1] != 0
    assert time.monotonic() - start < 30


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def _module_level_imports(path: Path) -> set[str]:
    """Top-level modules imported when ``path`` is imported (not inside functions or ``if TYPE_CHECKING:``)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", sorted(DISTRIBUTED.glob("*.py")), ids=lambda path: path.name)
def test_the_package_imports_neither_hydra_nor_lightning(path: Path) -> None:
    """The Hydra integration calls the launcher; :mod:`lightning_gaudi.hpu` uses the environment."""
    assert not _module_level_imports(path) & {"hydra", "omegaconf", "lightning", "pytorch_lightning"}


@pytest.mark.subprocess
def test_sigterm_to_the_launcher_stops_its_ranks_and_the_launcher(tmp_path: Path) -> None:
    """What a scheduler's preemption (or ``kill``) does to the Hydra app: the ranks get the SIGTERM and are gone, and
    the launcher ends by the same signal instead of leaving them training."""
    rank = (
        "import os, pathlib, sys, time;"
        " pathlib.Path(sys.argv[1], os.environ['LOCAL_RANK']).write_text(str(os.getpid())); time.sleep(120)"
    )
    launcher = (
        "import sys; from lightning_gaudi.distributed import launch_local_ranks;"
        f" launch_local_ranks([sys.executable, '-c', {rank!r}, {str(tmp_path)!r}], nprocs=2)"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 180  # the launcher imports lightning_gaudi first: a minute on a busy machine
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(path.read_text()) for path in tmp_path.iterdir()]
    assert len(pids) == 2, "the ranks did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
