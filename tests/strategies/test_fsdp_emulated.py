"""A real 2-process ``hpu_fsdp`` run under eager emulation (gloo): weights against a 1-process reference, per-rank
shards, and resuming from a sharded and from a full checkpoint.

One launched job (``helpers/fsdp_fit.py``, once per pytest run) trains every run in the same two processes (new
Trainers reusing the process group): a Python process importing Lightning costs seconds of CPU to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.damage import fingerprint
from helpers.job_runs import stderr_by_run
from helpers.models import make_net, regression_data
from helpers.shared_job import run_once

from lightning_gaudi import hpu

MOMENTUM = 0.9  # helpers/fsdp_fit.py's optimizer
STEPS = 4
RESUMED_STEPS = 6
EPOCHS = 3  # of the damaged-checkpoint runs
BATCH = 4  # per rank
HELPERS_DIR = Path(__file__).parents[1] / "helpers"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:  # a fresh launch: Lightning picks a free port
        env.pop(name, None)
    env[hpu.EMULATE_ENV] = "eager"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(HELPERS_DIR / "fsdp_fit.py"), str(out), *args]
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _ranks(out: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]


def _tensors(weights: dict[str, list[Any]]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value) for name, value in weights.items()}


def _reference(initial: dict[str, list[Any]], steps: list[tuple[Any, Any]]) -> dict[str, torch.Tensor]:
    """SGD with momentum in one process, step k on the union of both ranks' step-k batches.

    FSDP averages the two ranks' gradients in its reduce-scatter; with equal batch sizes and mean losses that is the
    gradient of the mean loss over the union, so the weights must agree up to float rounding.
    """
    net = make_net()
    net.load_state_dict({name.removeprefix("net."): torch.tensor(value) for name, value in initial.items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=MOMENTUM)
    for (x0, y0), (x1, y1) in steps:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.tensor(x0 + x1)), torch.tensor(y0 + y1)).backward()
        optimizer.step()
    return {f"net.{name}": tensor for name, tensor in net.state_dict().items()}


#: ``helpers/optimizer_saves.py``'s cases the job runs too (for tests/strategies/test_optimizer_saves.py)
SAVES = {"strategies": ["hpu_fsdp", "hpu_fsdp_sharded_checkpoint"], "optimizers": ["sgd", "adamw"], "models": ["odd"]}


def fsdp_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's folder (once per pytest run): the fit, resumed from its sharded and its full checkpoint, in the
    folder; the damaged-checkpoint runs in ``damaged``; the optimizer-saves cases in ``optimizer_saves``; its stderr in
    ``stderr.txt``."""

    def job(out: Path) -> None:
        saves = [",".join(values) for values in SAVES.values()]
        (out / "stderr.txt").write_text(_run(out, str(STEPS), str(RESUMED_STEPS), str(EPOCHS), *saves).stderr)

    return run_once(tmp_path_factory, "fsdp-job", job)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The job's folder and stderr."""
    out = fsdp_job(tmp_path_factory)
    return out, (out / "stderr.txt").read_text()


@pytest.mark.subprocess
def test_two_process_fit_matches_one_process_on_the_union_of_batches(fitted: tuple[Path, str]) -> None:
    out, stderr = fitted
    for rank in (0, 1):
        assert stderr.count(f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2 on HPU {rank}") == 1
    assert "HPUs: 2 per node x 1 node(s), GAUDI2 emulated on the CPU (eager mode), HCCL emulated over gloo" in stderr
    ranks = _ranks(out, "fit")
    initial = ranks[0]["initial"]
    assert ranks[1]["initial"] == initial
    total = sum(torch.tensor(value).numel() for value in initial.values())
    for rank, facts in enumerate(ranks):
        assert facts["global_rank"] == rank
        assert facts["wrapper"] == "FullyShardedDataParallel"
        assert facts["process_group_backend"] == "hccl"
        assert facts["steps"] == STEPS
        # FULL_SHARD: each rank holds about half of the parameters and of the optimizer state, all along
        for held in facts["parameter_elements"] + facts["optimizer_state_elements"]:
            assert total // 2 - 1 <= held <= total // 2 + 1, (held, total)
    assert ranks[0]["parameter_elements"][0] + ranks[1]["parameter_elements"][0] == total

    dataset = {tuple(row) for row in regression_data(32)[0].tolist()}
    for (x0, _), (x1, _) in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True):
        rows0, rows1 = {tuple(r) for r in x0}, {tuple(r) for r in x1}
        assert len(rows0) == len(rows1) == BATCH
        assert rows0 <= dataset
        assert rows1 <= dataset
        assert not rows0 & rows1, "both ranks trained on the same samples: the sampler did not shard the data"

    expected = _reference(initial, list(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)))
    final0, final1 = _tensors(ranks[0]["final"]), _tensors(ranks[1]["final"])
    for name, tensor in expected.items():
        assert torch.equal(final0[name], final1[name]), f"{name} differs between ranks"
        torch.testing.assert_close(final0[name], tensor, rtol=1e-5, atol=1e-6)
        assert not torch.equal(final0[name], torch.tensor(initial[name])), f"{name} never trained"
    assert_evaluated(out, final0)


def assert_evaluated(out: Path, final: dict[str, torch.Tensor]) -> None:
    """validate, test and predict after fit, on the same Trainer, use the trained weights (MSE on all 32 samples)."""
    x, y = regression_data(32)
    net = make_net()
    net.load_state_dict({name.removeprefix("net."): tensor for name, tensor in final.items()})
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(net(x), y).item()
    for rank in range(2):
        evaluated = json.loads((out / f"rank{rank}.eval.json").read_text())
        assert evaluated["validate"] == pytest.approx(loss, rel=1e-5)
        assert evaluated["test"] == pytest.approx(loss, rel=1e-5)
        assert evaluated["predicted"] == 16  # each rank predicts its half of the samples


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_a_checkpoint_resumes_to_the_same_weights(fitted: tuple[Path, str], kind: str) -> None:
    out, _ = fitted
    checkpoint = out / f"{kind}.ckpt"
    # the files as the fit saved them: the resumes read them and left every byte as it was
    assert fingerprint(checkpoint) == json.loads((out / "saved.json").read_text())[kind]
    if kind == "sharded":  # a directory of shards, renamed into place complete: no staging directory is left
        assert checkpoint.is_dir()
        assert (checkpoint / "meta.pt").is_file()
        assert {p.name for p in out.iterdir() if p.name.startswith(".")} == set()
    else:
        assert checkpoint.is_file()
        state = torch.load(checkpoint, weights_only=False)
        assert set(state["state_dict"]) == set(_ranks(out, "fit")[0]["initial"])  # full, plain parameter names

    fitted_ranks, resumed = _ranks(out, "fit"), _ranks(out, f"resume-{kind}")
    for facts in resumed:
        assert facts["start_step"] == STEPS
        assert facts["steps"] == RESUMED_STEPS
        assert facts["start"] == fitted_ranks[0]["final"]  # every weight restored, bit for bit
    # the momentum buffers were restored too: the resumed steps continue the reference's momentum
    steps = [
        *zip(fitted_ranks[0]["batches"], fitted_ranks[1]["batches"], strict=True),
        *zip(resumed[0]["batches"], resumed[1]["batches"], strict=True),
    ]
    assert len(steps) == RESUMED_STEPS
    expected = _reference(fitted_ranks[0]["initial"], steps)
    final0, final1 = _tensors(resumed[0]["final"]), _tensors(resumed[1]["final"])
    for name, tensor in expected.items():
        assert torch.equal(final0[name], final1[name])
        torch.testing.assert_close(final0[name], tensor, rtol=1e-5, atol=1e-6)


@pytest.mark.subprocess
def test_a_damaged_sharded_checkpoint_resumes_from_the_intact_older_one_on_every_rank(
    fitted: tuple[Path, str],
) -> None:
    """Rank 1's shard of the newest checkpoint has bytes flipped (its length kept). With its checksum index, every
    rank's resume policy skips it; an older folder without one verifies, fails to load (on every rank, as torch's
    reader gathers the error) and is moved aside. Both resume from the intact older checkpoint to the uninterrupted
    run's weights."""
    out, stderr = fitted
    straight = out / "damaged" / "straight"
    written = sorted(p.name for p in (straight / "ckpt").iterdir())
    assert written == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt"]
    final = _ranks(straight, "checkpointed")[0]["final"]
    cases = {checksums: f"checksums-{checksums}" for checksums in (True, False)}
    output = stderr_by_run(stderr)
    assert list(output) == list(cases.values()), stderr[-4000:]
    for checksums, case in cases.items():
        run = out / "damaged" / case
        newest = run / "ckpt" / written[1]
        moved = [line for line in output[case].splitlines() if "could not load the checkpoint" in line]
        assert len(moved) == (0 if checksums else 1), output[case][-4000:]
        assert all(str(newest) in line for line in moved), moved
        assert Path(f"{newest}.unloadable").is_dir() is not checksums  # moved aside, never deleted
        for rank, facts in enumerate(_ranks(run, "resume-auto")):
            assert facts["start_step"] == 4, f"rank {rank} did not resume from the intact older checkpoint"
            assert facts["final"] == final, f"rank {rank} ended elsewhere than the uninterrupted run"
