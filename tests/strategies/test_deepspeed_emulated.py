"""Real 2-process ``hpu_deepspeed`` fits under eager emulation (DeepSpeed's CPU accelerator, gloo), checked against
one process on the union of the batches, and a checkpoint directory resumed.

One 2-process torchrun job of ``helpers/deepspeed_fit.py``, once per pytest run: the ZeRO-2 and ZeRO-3 fits one after
another, then a checkpointed ZeRO-3 run followed by its two resumes. Each test reads its run's facts from the run's
subfolder, and its stderr lines from the job's ``stderr.txt``; ``tests/strategies/test_clean_exit.py`` reads the
job's exit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.job_runs import stderr_by_run
from helpers.models import regression_data
from helpers.shared_job import run_once
from lightning_utilities.core.imports import RequirementCache

from strategies.test_fsdp_emulated import assert_evaluated
from strategies.test_model_parallel import run_helper
from strategies.test_parallel_emulated import _reference, _rows

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        not RequirementCache("deepspeed"), reason="DeepSpeed is not installed (scripts/setup.sh installs it)"
    ),
]


def deepspeed_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's folder (the fits in subfolders named by their strategies; ``straight``, ``resumed`` and ``auto``:
    the checkpointed runs), its stderr in ``stderr.txt``."""

    def job(out: Path) -> None:
        strategies = ",".join(strategy for strategy, _ in FITS)
        proc = run_helper("deepspeed_fit.py", out, strategies, "fit,checkpointed", timeout=480, torchrun=True)
        (out / "stderr.txt").write_text(proc.stderr)

    return run_once(tmp_path_factory, "deepspeed-fits-and-checkpoints", job)


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _tensors(weights: dict[str, list[Any]]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value) for name, value in weights.items()}


# ZeRO-1 runs the same DeepSpeed optimizer as ZeRO-2 (gradients kept whole); its name and config are unit-tested.
# ZeRO-3 comes last: its engine replaces torch.nn.functional.linear for the life of the process.
FITS = [("deepspeed_stage_2", 2), ("hpu_deepspeed_stage_3", 3)]


@pytest.fixture(scope="module")
def fits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's folder: each ZeRO fit in the subfolder named by its strategy."""
    return deepspeed_job(tmp_path_factory)


def test_the_fit_job_forms_one_process_group_for_all_its_fits(fits: Path) -> None:
    stderr = (fits / "stderr.txt").read_text()
    assert stderr.count("distributed_backend=hccl\nAll distributed processes registered. Starting with 2") == 1


@pytest.mark.parametrize(("strategy", "stage"), FITS)
def test_two_ranks_match_one_process_on_the_union(fits: Path, strategy: str, stage: int) -> None:
    """ZeRO with SGD and no clipping: both ranks end with the weights one process reaches on the union of their
    batches (Lightning's name ``deepspeed_stage_2`` runs the HPU strategy too); under ZeRO-3 each rank holds about
    half of the parameters while it trains."""
    out = fits / strategy
    ranks = _ranks(out)
    for rank, facts in enumerate(ranks):
        assert facts["global_rank"] == rank
        assert facts["strategy"] == "HPUDeepSpeedStrategy"
        assert facts["engine"] == "DeepSpeedEngine"
        assert facts["zero_stage"] == stage
        assert facts["gradient_clipping"] == 0.0  # not DeepSpeed's default of 1.0
        assert facts["process_group_backend"] == "hccl"
        assert facts["steps"] == 4
        total = facts["total"][0]
        assert total == 49
        if stage == 3:
            # each parameter is split in two, padded to an even length: 16 + 4 + 4 + 1 of 32 + 8 + 8 + 1
            assert facts["held"] == [25] * 4
        else:
            assert facts["held"] == [total] * 4
    initial = ranks[0]["initial"]
    assert ranks[1]["initial"] == initial
    dataset = _rows(regression_data(32)[0].tolist())
    for (x0, _), (x1, _) in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True):
        assert _rows(x0) <= dataset
        assert _rows(x1) <= dataset
        assert not _rows(x0) & _rows(x1), "both ranks trained on the same samples"
    expected = _reference(initial, list(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)))
    alone = _reference(initial, [(batch, batch) for batch in ranks[0]["batches"]])  # rank 0 unsynchronized
    final0, final1 = _tensors(ranks[0]["final"]), _tensors(ranks[1]["final"])
    for name, tensor in expected.items():
        assert torch.equal(final0[name], final1[name]), f"{name} differs between ranks"
        torch.testing.assert_close(final0[name], tensor, rtol=1e-5, atol=1e-6)
        assert not torch.equal(final0[name], torch.tensor(initial[name])), f"{name} never trained"
    assert any(not torch.allclose(alone[n], expected[n], rtol=1e-3, atol=1e-4) for n in expected), "cannot tell"
    assert_evaluated(out, final0)  # validate, test and predict after fit, on the same Trainer


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's folder: a ZeRO-3 run of 2 epochs with a checkpoint directory after each (``straight``), then in the
    same processes epoch 2 resumed from the first directory (``resumed``) and through the ``"auto"`` policy over
    copies of both, the newest made unloadable (``auto``)."""
    return deepspeed_job(tmp_path_factory)


@pytest.fixture
def straight(job: Path) -> Path:
    """The uninterrupted run's folder (read only)."""
    return job / "straight"


def test_a_checkpoint_directory_resumes_to_the_same_weights(job: Path, straight: Path) -> None:
    """ZeRO-3 (every rank writes its shards): 2 epochs straight, and epoch 2 resumed from the directory written after
    epoch 1, end with the same weights; no staging directory is left behind."""
    resumed = job / "resumed"
    written = sorted(path.name for path in (straight / "ckpt").iterdir())
    assert written == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
    first = straight / "ckpt" / "epoch=0-step=2.ckpt"
    assert (first / "latest").read_text().strip() == "checkpoint"
    shards = sorted(path.name for path in (first / "checkpoint").iterdir())
    assert "zero_pp_rank_0_mp_rank_00_model_states.pt" in shards
    assert "zero_pp_rank_1_mp_rank_00_model_states.pt" in shards
    facts_straight, facts_resumed = _ranks(straight), _ranks(resumed)
    assert facts_straight[0]["steps"] == facts_resumed[0]["steps"] == 4
    assert len(facts_resumed[0]["batches"]) == 2  # only the second epoch ran again
    assert facts_resumed[0]["batches"] == facts_straight[0]["batches"][2:]
    for rank in (0, 1):
        final, again = _tensors(facts_straight[rank]["final"]), _tensors(facts_resumed[rank]["final"])
        for name, tensor in final.items():
            # only 2 of the 4 steps ran here: equal weights mean the first 2 came from the checkpoint
            torch.testing.assert_close(again[name], tensor, rtol=0, atol=0)
    assert facts_resumed[0]["ckpt_path"] == facts_resumed[1]["ckpt_path"] == str(first)
    assert not list((straight / "ckpt").glob(".*.tmp")), "a staging directory was left behind"


def test_a_checkpoint_that_fails_to_load_is_moved_aside_on_every_rank(job: Path, straight: Path) -> None:
    """The newest checkpoint verifies but fails to load on both ranks: it is moved aside, named once, and both ranks
    resume from the older one, to the uninterrupted run's weights."""
    resumed = job / "auto"
    ckpt = resumed / "ckpt"
    broken = ckpt / "epoch=1-step=4.ckpt"
    facts_straight, facts_resumed = _ranks(straight), _ranks(resumed)
    for facts in facts_resumed:
        assert facts["ckpt_path"] == str(broken)  # the policy's pick on every rank: nothing in its bytes tells
    stderr = stderr_by_run((job / "stderr.txt").read_text())["auto"]
    warnings = [line for line in stderr.splitlines() if "could not load the checkpoint" in line]
    assert len(warnings) == 1, stderr[-4000:]
    assert str(broken) in warnings[0]
    assert f"resuming from {ckpt / 'epoch=0-step=2.ckpt'}" in warnings[0]
    assert (ckpt / "epoch=1-step=4.ckpt.unloadable" / "checkpoint").is_dir()  # moved, not deleted
    assert sorted(path.name for path in (straight / "ckpt").iterdir()) == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
    assert not list((straight / "ckpt").glob(".*.tmp")), "the straight run's own checkpoints were touched"
    assert facts_resumed[0]["batches"] == facts_straight[0]["batches"][2:]  # from step 2, on both ranks
    for rank in (0, 1):
        final, again = _tensors(facts_straight[rank]["final"]), _tensors(facts_resumed[rank]["final"])
        for name, tensor in final.items():
            torch.testing.assert_close(again[name], tensor, rtol=0, atol=0)
