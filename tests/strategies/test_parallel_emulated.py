"""Real 2-process ``hpu_parallel`` runs under eager emulation (gloo behind HCCL's rules), checked against a
1-process reference.

The DDP, synchronized batch norm and fast DDP fits run one after another in one 2-process job (the ``scenarios``
fixture, once per pytest run): each test reads its fit's facts from the job's folder. A second job fails on purpose
(the ``failed_job`` fixture): a hung rank and HCCL's missing AVG, read by one test each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.models import make_net, regression_data
from helpers.shared_job import run_once

from lightning_gaudi import hpu

STEPS = 4
BATCH = 4  # per rank
ACCUMULATE = 2  # the fast DDP fit's micro-batches per step
HELPERS_DIR = Path(__file__).parents[1] / "helpers"
#: (bucket_cap_mb, gradient_as_bucket_view, static_graph) of the DDP fits
DDP_SETTINGS = [(0.5, True, True), (2, False, False)]


def _ddp_name(bucket_cap_mb: float, gradient_as_bucket_view: bool, static_graph: bool) -> str:
    """The job's subfolder of one DDP fit."""
    return f"ddp-{bucket_cap_mb}-{int(gradient_as_bucket_view)}-{int(static_graph)}"


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's folder: ``helpers/parallel_scenarios.py``'s fits in one 2-process job, each fit's facts in its own
    subfolder, the job's stderr in ``stderr.txt``."""

    def job(out: Path) -> None:
        out.mkdir()
        launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
        for name in launch_vars:  # a fresh launch: Lightning picks a free port
            env.pop(name, None)
        env[hpu.EMULATE_ENV] = "eager"
        settings = [f"{_ddp_name(*s)}={s[0]},{int(s[1])},{int(s[2])}" for s in DDP_SETTINGS]
        script = str(HELPERS_DIR / "parallel_scenarios.py")
        command = [sys.executable, script, str(out), str(STEPS), str(ACCUMULATE), *settings]
        proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=360)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        (out / "stderr.txt").write_text(proc.stderr)

    return run_once(tmp_path_factory, "parallel-emulated-scenarios", job)


@pytest.mark.subprocess
def test_the_job_forms_one_process_group_for_all_its_fits(scenarios: Path) -> None:
    """Lightning's start-up lines: one per rank, then rank zero's summary, naming the backend and the device; once in
    the job, whose later fits keep the group the first one formed."""
    stderr = (scenarios / "stderr.txt").read_text()
    assert stderr.count("using: 2 HPUs, strategy HPUParallelStrategy") == len(DDP_SETTINGS) + 2  # every fit's Trainer
    for rank in (0, 1):
        assert stderr.count(f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2 on HPU {rank}") == 1
    assert stderr.count("distributed_backend=hccl\nAll distributed processes registered. Starting with 2") == 1
    assert "HPUs: 2 per node x 1 node(s), GAUDI2 emulated on the CPU (eager mode), HCCL emulated over gloo" in stderr


def _reference(initial: dict[str, list], batches: list[list[list[list[float]]]]) -> dict[str, torch.Tensor]:
    """Plain SGD in one process, step k on the union of both ranks' step-k batches.

    DDP averages the two ranks' gradients; with equal batch sizes and mean losses that is the gradient of the mean
    loss over the union, so the weights must agree up to float rounding.
    """
    net = make_net()
    net.load_state_dict({name.removeprefix("net."): torch.tensor(value) for name, value in initial.items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for (x0, y0), (x1, y1) in batches:
        x = torch.tensor(x0 + x1)
        y = torch.tensor(y0 + y1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return {f"net.{name}": tensor for name, tensor in net.state_dict().items()}


def _rows(x: list[list[float]]) -> set[tuple[float, ...]]:
    return {tuple(row) for row in x}


@pytest.mark.subprocess
@pytest.mark.parametrize(("bucket_cap_mb", "gradient_as_bucket_view", "static_graph"), DDP_SETTINGS)
def test_two_process_hpu_parallel(
    scenarios: Path, bucket_cap_mb: float, gradient_as_bucket_view: bool, static_graph: bool
) -> None:
    out = scenarios / _ddp_name(bucket_cap_mb, gradient_as_bucket_view, static_graph)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, facts in enumerate(ranks):
        assert facts["global_rank"] == rank
        assert facts["world_size"] == 2
        assert facts["strategy"] == "HPUParallelStrategy"
        assert facts["process_group_backend"] == "hccl"
        assert facts["steps"] == STEPS
        # the strategy's settings reached torch's DistributedDataParallel object
        assert facts["bucket_bytes_cap"] == int(bucket_cap_mb * 1024 * 1024)
        assert facts["gradient_as_bucket_view"] is gradient_as_bucket_view
        assert facts["static_graph"] is static_graph
        assert facts["find_unused_parameters"] is False
        # every gradient really lives in a bucket the reducer all-reduced, exactly when asked for
        assert facts["views_per_step"] == [gradient_as_bucket_view] * STEPS
        # the communication hook given to the strategy runs for every bucket of every step
        assert facts["hook_calls"] >= STEPS
        # with bucket views the first step's gradients are released before DDP rebuilds its buckets
        assert facts["grads_released"] == [True, gradient_as_bucket_view] + [False] * (STEPS - 2)

    initial = ranks[0]["initial"]
    assert ranks[1]["initial"] == initial  # DDP broadcast rank 0's weights at wrap time
    final0 = {name: torch.tensor(value) for name, value in ranks[0]["final"].items()}
    final1 = {name: torch.tensor(value) for name, value in ranks[1]["final"].items()}
    dataset = _rows(regression_data(32)[0].tolist())
    seen0 = [_rows(x) for x, _ in ranks[0]["batches"]]
    seen1 = [_rows(x) for x, _ in ranks[1]["batches"]]
    assert len(seen0) == len(seen1) == STEPS
    for rows0, rows1 in zip(seen0, seen1, strict=True):
        assert len(rows0) == len(rows1) == BATCH
        assert rows0 <= dataset
        assert rows1 <= dataset
        assert not rows0 & rows1, "both ranks trained on the same samples: the sampler did not shard the data"
    expected = _reference(initial, list(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)))
    for name, tensor in expected.items():
        assert torch.equal(final0[name], final1[name]), f"{name} differs between ranks"
        torch.testing.assert_close(final0[name], tensor, rtol=1e-5, atol=1e-6)
        assert not torch.equal(final0[name], torch.tensor(initial[name])), f"{name} never trained"


def _bn_reference(initial: dict[str, list], batches: list[tuple[list, list]]) -> dict[str, torch.Tensor]:
    """One process, plain batch norm and SGD, step k on the given rows: what synchronized batch norm over the ranks'
    step-k batches must reproduce (running statistics and weights)."""
    from helpers.syncbn_fit import make_bn_net

    net = make_bn_net()
    net.load_state_dict({name: torch.tensor(value) for name, value in initial.items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.tensor(x)), torch.tensor(y)).backward()
        optimizer.step()
    return net.state_dict()


@pytest.mark.subprocess
def test_sync_batchnorm_in_eager_emulation(scenarios: Path) -> None:
    """Trainer(sync_batchnorm=True) with hpu_parallel: the running statistics of 2 ranks equal one process's over the
    union of their batches (buffers are not broadcast, so only the synchronization can make them agree)."""
    ranks = [json.loads((scenarios / "syncbn" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for facts in ranks:
        assert facts["steps"] == STEPS
        assert facts["layer_sync"] == "HPUSyncBatchNorm"
        assert facts["bn_class_in_fit"] == "EmulatedSyncBatchNorm"
        assert facts["bn_class_after_fit"] == "BatchNorm1d"  # reverted after fit
    initial = ranks[0]["initial"]
    union = [(x0 + x1, y0 + y1) for (x0, y0), (x1, y1) in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)]
    expected = _bn_reference(initial, union)
    alone = _bn_reference(initial, [(x, y) for x, y in ranks[0]["batches"]])  # rank 0 without synchronization
    final = [{name: torch.tensor(value) for name, value in facts["final"].items()} for facts in ranks]
    assert final[0]["1.num_batches_tracked"].item() == STEPS
    for name in ("1.running_mean", "1.running_var"):
        assert torch.equal(final[0][name], final[1][name]), f"{name} differs between ranks"
        torch.testing.assert_close(final[0][name], expected[name], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(alone[name], expected[name], rtol=1e-3, atol=1e-4), "the check cannot tell"
    for name, tensor in expected.items():  # gradients through the synchronized statistics, too
        torch.testing.assert_close(final[0][name], tensor, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final[1][name], tensor, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """``helpers/hung_rank_fit.py``'s job (once per pytest run): in the second step rank 0 all-reduces with
    ``ReduceOp.AVG`` while rank 1 hangs. Its exit code and whether rank 1 was gone within 10 s of its end (killed
    then if not), and its stderr."""

    def job(out: Path) -> None:
        out.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK"):
            env.pop(name, None)
        env[hpu.EMULATE_ENV] = "eager"
        command = [sys.executable, str(HELPERS_DIR / "hung_rank_fit.py"), str(out)]
        proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=120)
        (out / "stderr.txt").write_text(proc.stderr)
        rank1 = int((out / "rank1.pid").read_text())
        deadline, gone = time.monotonic() + 10, False
        while not gone and time.monotonic() < deadline:
            try:
                os.kill(rank1, 0)
                time.sleep(0.2)
            except ProcessLookupError:
                gone = True
        if not gone:
            os.kill(rank1, 9)
        (out / "facts.json").write_text(json.dumps({"returncode": proc.returncode, "rank1_gone": gone}))

    out = run_once(tmp_path_factory, "parallel-emulated-failed-job", job)
    return json.loads((out / "facts.json").read_text()), (out / "stderr.txt").read_text()


@pytest.mark.subprocess
def test_a_failed_job_ends_its_hung_rank(failed_job: tuple[dict[str, Any], str]) -> None:
    """Rank 0 fails while rank 1 hangs: the strategy ends the rank it started instead of leaving it holding its memory,
    sockets and, on Gaudi, its card until the collective timeout (or forever, as here)."""
    facts, stderr = failed_job
    assert facts["returncode"] != 0
    assert "RuntimeError: Unsupported ReduceOp for HCCL process group" in stderr, stderr[-3000:]
    assert facts["rank1_gone"], "rank 1 outlived the failed job"


@pytest.mark.subprocess
def test_an_avg_all_reduce_in_a_step_fails_as_on_hccl(failed_job: tuple[dict[str, Any], str]) -> None:
    """HCCL has no ReduceOp.AVG: the emulated process group refuses it with the bridge's words (gloo alone would
    average), and the error names the way out."""
    facts, stderr = failed_job
    assert facts["returncode"] != 0
    assert "RuntimeError: Unsupported ReduceOp for HCCL process group" in stderr, stderr[-3000:]
    assert "all-reduce a SUM and divide by the world size" in stderr


@pytest.mark.subprocess
def test_fast_ddp_equals_one_process_on_the_union(scenarios: Path) -> None:
    """``hpu_fast_ddp``: no DDP wrapper; rank 0's weights broadcast at set-up, the gradients averaged after backward
    in one flat buffer, not while they accumulate: both ranks end with the weights of one process on the union. (Two
    micro-batches per step cover both the accumulating and the stepping micro-batch.)"""
    ranks = [json.loads((scenarios / "fast_ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["initial"] == ranks[1]["initial"], "rank 0's weights were not broadcast"
    for facts in ranks:
        assert facts["wrapper"] == "Perturbed"  # the LightningModule itself: no DistributedDataParallel
        assert facts["steps"] == STEPS
        assert facts["gradient_all_reduces"] == STEPS  # one flat buffer per optimizer step, none while accumulating
    net = make_net()
    net.load_state_dict({name.removeprefix("net."): torch.tensor(v) for name, v in ranks[0]["initial"].items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    micro = list(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True))
    for step in range(STEPS):
        optimizer.zero_grad()
        for (x0, y0), (x1, y1) in micro[step * ACCUMULATE : (step + 1) * ACCUMULATE]:
            loss = torch.nn.functional.mse_loss(net(torch.tensor(x0 + x1)), torch.tensor(y0 + y1))
            (loss / ACCUMULATE).backward()
        optimizer.step()
    for name, tensor in net.state_dict().items():
        final0, final1 = (torch.tensor(r["final"][f"net.{name}"]) for r in ranks)
        assert torch.equal(final0, final1), f"{name} differs between ranks"
        torch.testing.assert_close(final0, tensor, rtol=1e-5, atol=1e-6)
