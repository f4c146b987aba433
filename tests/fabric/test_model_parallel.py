"""Fabric's sharded HPU strategies (``hpu_model_parallel``, ``hpu_fsdp``): set-up checks, then real 2-process loops
under eager emulation against one process on the same data, with ``fabric.save``/``fabric.load`` of sharded state
(every strategy's loop in turn at the end of tests/strategies/test_model_parallel.py's 2-process torchrun job, once
per pytest run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy
from torch import nn

from lightning_gaudi import fabric, hpu
from lightning_gaudi.fabric import HPUFSDPPrecision, HPUFSDPStrategy, HPUModelParallelStrategy
from tests.strategies.test_model_parallel import FABRIC_STEPS as STEPS
from tests.strategies.test_model_parallel import FABRIC_TOTAL as TOTAL
from tests.strategies.test_model_parallel import fsdp2_reduces_with_sums, layouts_job

BATCH, MOMENTUM, CLIP = 8, 0.9, 0.5  # helpers/fabric_sharded.py's


def _identity(module: nn.Module, mesh: Any) -> nn.Module:
    return module


def test_names_and_lightnings_objects_build_the_hpu_classes(eager_hpu: hpu.Backend) -> None:
    built = Fabric(accelerator="hpu", strategy="fsdp", devices=2, precision="bf16-mixed")
    assert type(built.strategy) is HPUFSDPStrategy
    assert isinstance(built.strategy.precision, HPUFSDPPrecision)
    assert built.strategy._get_process_group_backend() == "hccl"
    assert type(Fabric(accelerator="hpu", strategy="hpu_fsdp", devices=2).strategy) is HPUFSDPStrategy
    strategy = HPUModelParallelStrategy(_identity)
    assert Fabric(accelerator="hpu", strategy=strategy, devices=2).strategy is strategy
    adopted = Fabric(accelerator="hpu", strategy=ModelParallelStrategy(_identity), devices=2).strategy
    assert type(adopted) is HPUModelParallelStrategy
    assert type(Fabric(accelerator="hpu", strategy=FSDPStrategy(), devices=2).strategy) is HPUFSDPStrategy
    assert {"hpu_fsdp", "hpu_model_parallel"} <= set(fabric.register.__globals__["STRATEGY_REGISTRY"])


def test_bad_sizes_and_lazy_mode_are_refused_while_fabric_is_built(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`data_parallel_size=2` x `tensor_parallel_size=2` must equal the world"):
        Fabric(accelerator="hpu", strategy=HPUModelParallelStrategy(_identity, 2, 2), devices=2)
    with pytest.raises(ValueError, match=r"`tensor_parallel_size=-1` must be a positive int or 'auto'"):
        Fabric(accelerator="hpu", strategy=HPUModelParallelStrategy(_identity, 1, -1), devices=2)


def test_lazy_mode_is_refused(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"'hpu_model_parallel' cannot run in lazy mode: Intel supports DTensor"):
        Fabric(accelerator="hpu", strategy=HPUModelParallelStrategy(_identity), devices=1)
    with pytest.raises(ValueError, match=r"'hpu_fsdp' cannot run in lazy mode"):
        Fabric(accelerator="hpu", strategy="hpu_fsdp", devices=1)


def _reference(initial: dict[str, list[Any]], rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """The loop in one process on each step's rows (the union of the data-parallel ranks')."""
    x = torch.randn(TOTAL * BATCH, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    net.load_state_dict({name: torch.tensor(value) for name, value in initial.items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=MOMENTUM)
    for step_rows in rows:
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x[step_rows]), y[step_rows]).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        optimizer.step()
    return {name: tensor for name, tensor in net.state_dict().items()}


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of ``helpers/fabric_sharded.py``'s loops in the layouts job, each kind's in its subfolder."""
    return layouts_job(tmp_path_factory) / "fabric"


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["tp", "fsdp2", "fsdp"])
def test_two_processes_match_one_and_a_sharded_checkpoint_resumes(loops: Path, kind: str) -> None:
    if kind == "fsdp2" and not fsdp2_reduces_with_sums():
        pytest.skip(f"torch {torch.__version__}'s FSDP2 cannot reduce with HCCL's ops: refused at set-up")
    out = loops / kind
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["initial"] == ranks[1]["initial"]
    assert ranks[0]["strategy"] == ("HPUFSDPStrategy" if kind == "fsdp" else "HPUModelParallelStrategy")
    # one file per rank plus the metadata, renamed into place complete: no staging directory left
    assert {"__0_0.distcp", "__1_0.distcp", "meta.pt"} <= set(ranks[0]["checkpoint_files"])
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["newest.ckpt.unloadable", "older.ckpt"]
    rows = [sorted({row for facts in ranks for row in facts["rows"][step]}) for step in range(TOTAL)]
    expected = _reference(ranks[0]["initial"], rows)
    for facts in ranks:
        assert facts["loaded_step"] == STEPS
        # the newest checkpoint damaged: skipped by its checksums, or (without) moved aside once it failed to load;
        # every rank resumes from the intact older one, to the uninterrupted weights
        for checksums in (True, False):
            damaged = facts[f"damaged-checksums-{checksums}"]
            assert damaged["chosen"] == ("older.ckpt" if checksums else "newest.ckpt")
            assert damaged["loaded_step"] == STEPS
            assert damaged["resumed"] == facts["uninterrupted"]
        for name, tensor in expected.items():
            torch.testing.assert_close(torch.tensor(facts["uninterrupted"][name]), tensor, rtol=1e-5, atol=1e-6)
            assert facts["resumed"][name] == facts["uninterrupted"][name], name  # resumed: the same, bit for bit
            assert facts["uninterrupted"][name] != ranks[0]["initial"][name], f"{name} never trained"
