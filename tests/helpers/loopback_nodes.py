"""Several simulated nodes on one machine: torchrun agents (or other launchers) meeting on 127.0.0.1.

Each node's launcher runs in its own session with its output in ``<out>/agent<node>.log``; a job still running after
``JOB_TIMEOUT_S`` is killed (whole sessions) and fails the test with the logs' tails. The jobs run
``tests/reliability_helpers/elastic_fit.py`` (``FIT``), whose weights after ``n`` steps depend on ``n`` alone
(``elastic_fit.reference_weights``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from lightning_gaudi import hpu

FIT = Path(__file__).parents[1] / "reliability_helpers" / "elastic_fit.py"
JOB_TIMEOUT_S = 240
#: what a launcher sets; removed from the tests' environment so that only the simulated launch's values apply
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")
LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "PMIX_")


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, in eager emulation, one torch thread, plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(LAUNCH_PREFIXES)}
    env.update({hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_nodes(out: Path, commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]]) -> tuple[list[int], str]:
    """Starts ``commands[i]`` with ``envs[i]`` for each node ``i``, waits for all; returns the exit codes and the logs.

    ``out`` is created; each node's output goes to ``out/agent<i>.log``.
    """
    out.mkdir(parents=True)
    logs = [out / f"agent{node}.log" for node in range(len(commands))]
    procs = []
    for command, env, log in zip(commands, envs, logs, strict=True):
        with open(log, "wb") as f:
            procs.append(
                subprocess.Popen(
                    list(command), env=dict(env), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        codes = [proc.wait(timeout=max(deadline - time.monotonic(), 1)) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # each node leads its own session: this ends its workers too
        text = "\n".join(f"--- {log}\n{log.read_text()[-4000:]}" for log in logs)
        pytest.fail(f"job still running after {JOB_TIMEOUT_S}s\n{text}")
    return codes, "\n".join(log.read_text() for log in logs)


def run_two_node_job(
    out: Path, *args: str, max_restarts: int = 3, monitor_interval: float = 0.2
) -> tuple[list[int], str]:
    """Two torchrun agents, one process each, meeting on 127.0.0.1 (a 2-node job on one machine), running ``FIT``.

    ``monitor_interval``: how often an agent looks at its worker and the rendezvous. After a rank dies, the other
    agent stops its worker (SIGTERM) at its next look, possibly before that worker has met the lost peer.
    """
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", out.name]
    cmd += ["--max-restarts", str(max_restarts), "--monitor-interval", str(monitor_interval), str(FIT), str(out), *args]
    return run_nodes(out, [cmd, cmd], [loopback_env(), loopback_env()])


def two_node_job(out: Path) -> None:
    """The 2-node torchrun job several tests read (through ``shared_job.run_once(..., "two-nodes", two_node_job)``):
    10 steps, checkpoints every 5."""
    codes, log = run_two_node_job(out, "--max-steps", "10", "--every", "5")
    assert codes == [0, 0], log[-6000:]
