"""Importing Intel's bridge invents a rendezvous (``MASTER_ADDR=localhost``, ``MASTER_PORT=12345``); the seam keeps
the launcher's and otherwise leaves Lightning to pick a free port (``lightning_gaudi/hpu/bridge.py``,
``keep_rendezvous``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.hpu import bridge

TESTS_DIR = Path(__file__).parents[1]
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "HLS_MODULE_ID", "ID")


@pytest.fixture
def no_rendezvous(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    for name in (*RENDEZVOUS, "HABANA_VISIBLE_MODULES", "PT_HPU_LAZY_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name in [name for name in os.environ if name.startswith("OMPI_COMM_WORLD_")]:
        monkeypatch.delenv(name)
    return bridge_double


@pytest.mark.double_only("reads what the double sets on import, in a process where it was not imported yet")
def test_importing_the_double_sets_what_the_bridge_sets(no_rendezvous: ModuleType) -> None:
    import habana_frameworks.torch  # noqa: F401  (as `import habana_frameworks.torch` does on a Gaudi)

    assert os.environ["MASTER_ADDR"] == "localhost"
    assert os.environ["MASTER_PORT"] == "12345"
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "HLS_MODULE_ID" not in os.environ
    assert "ID" not in os.environ
    assert torch.hpu is sys.modules["habana_frameworks.torch.hpu"]  # core/__init__.py:46
    assert torch.distributed.is_backend_available("hccl")


@pytest.mark.double_only("reads what the double sets on import")
def test_the_import_maps_open_mpi_and_picks_the_card(
    no_rendezvous: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_RANK": "3",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")
    import habana_frameworks.torch  # noqa: F401

    got = {name: os.environ.get(name) for name in RENDEZVOUS}
    assert got == {
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "12345",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "HLS_MODULE_ID": "5",  # HABANA_VISIBLE_MODULES[local rank]
        "ID": "3",
    }


@pytest.mark.double_only("the double's import-time ValueError")
def test_the_import_reads_pt_hpu_lazy_mode_as_an_integer(
    no_rendezvous: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "false")
    with pytest.raises(ValueError, match="invalid literal for int"):
        import habana_frameworks.torch.distributed.hccl  # noqa: F401


def test_the_seam_leaves_the_port_to_lightning(no_rendezvous: ModuleType) -> None:
    backend = hpu.get_backend()
    assert backend.device_count() == 8  # imports the bridge
    assert "habana_frameworks.torch.distributed.hccl" in sys.modules
    assert "MASTER_ADDR" not in os.environ
    assert "MASTER_PORT" not in os.environ


def test_the_seam_keeps_the_launchers_rendezvous(no_rendezvous: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "12345")  # the user's, even where it is the bridge's number
    hpu.get_backend().device_count()
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.7", "12345")


@pytest.mark.double_only("imports the double before the seam, as torch's device autoload imports the bridge")
def test_a_bridge_loaded_before_the_seam_loses_the_invented_port(no_rendezvous: ModuleType) -> None:
    import habana_frameworks.torch  # noqa: F401  (`import torch` does this in eager mode: torch's device autoload)

    assert os.environ["MASTER_PORT"] == "12345"
    started = bridge._started_with()
    assert started is not None
    assert "MASTER_PORT" not in started
    hpu.get_backend()
    assert "MASTER_ADDR" not in os.environ
    assert "MASTER_PORT" not in os.environ


def _job(folder: Path) -> subprocess.Popen[bytes]:
    folder.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in (*RENDEZVOUS, hpu.EMULATE_ENV)}
    path = [str(TESTS_DIR / "bridge_double"), str(TESTS_DIR / "helpers"), str(TESTS_DIR.parent)]
    env.update(PYTHONPATH=os.pathsep.join(path), PT_HPU_LAZY_MODE="0", OMP_NUM_THREADS="1")
    command = [sys.executable, str(TESTS_DIR / "helpers" / "bridge_double_fit.py"), str(folder)]
    with open(folder / "job.log", "wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)


@pytest.mark.subprocess
@pytest.mark.double_only("runs the double's package in fresh processes")
def test_two_jobs_on_one_node_both_finish(tmp_path: Path) -> None:
    """Two 2-card DDP jobs started at once on one machine: with the bridge's port both would rendezvous on 12345."""
    jobs = {name: _job(tmp_path / name) for name in ("first", "second")}
    for name, process in jobs.items():
        try:
            returncode = process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = None
        assert returncode == 0, (tmp_path / name / "job.log").read_text()[-4000:]
    ports = set()
    for name in jobs:
        facts = [json.loads((tmp_path / name / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        assert [fact["backend"] for fact in facts] == ["hccl", "hccl"]
        assert facts[0]["world_size"] == 2
        assert facts[0]["master_port"] == facts[1]["master_port"] != "12345"
        assert facts[0]["final"] == facts[1]["final"]
        ports.add(facts[0]["master_port"])
    assert len(ports) == 2


def test_a_worker_given_one_card_keeps_it(no_rendezvous: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's second worker of two on a node, given ``{"HPU": 1}``: the bridge would index its one visible card by the
    local rank and stop on its assertion; the seam names the card first."""
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "5")
    hpu.get_backend().init_distributed(world_size=2, rank=1, local_rank=1)
    assert os.environ["HLS_MODULE_ID"] == "5"
    assert (os.environ["LOCAL_RANK"], os.environ["ID"]) == ("1", "1")
