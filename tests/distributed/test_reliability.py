"""Distributed reliability under eager emulation: two torchrun node agents on loopback, a killed rank that resumes,
a hung peer that times out, a save killed half-way, checkpoints that move between HPU and CPU.

The torchrun jobs run ``tests/reliability_helpers/elastic_fit.py``; see its docstring for what each rank records.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.loopback_nodes import FIT, JOB_TIMEOUT_S, run_two_node_job, two_node_job
from helpers.loopback_nodes import loopback_env as _env
from helpers.shared_job import run_once
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gaudi import hpu, resume

HELPERS = FIT.parent
sys.path.insert(0, str(HELPERS))
import elastic_fit  # noqa: E402


def _records(out: Path, name: str, rank: int) -> list[tuple[int, int]]:
    lines = (out / f"{name}-rank{rank}.txt").read_text().split()
    return [(int(a), int(s)) for a, s in zip(lines[::2], lines[1::2], strict=True)]


def _assert_weights(out: Path, steps: int) -> None:
    finals = [torch.load(out / f"final-rank{rank}.pt") for rank in range(2)]
    reference = elastic_fit.reference_weights(steps)
    assert finals[0].keys() == reference.keys()
    for name, expected in reference.items():
        assert torch.equal(finals[0][name], finals[1][name]), f"ranks disagree on {name}"
        torch.testing.assert_close(finals[0][name], expected, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_once(tmp_path_factory, "two-nodes", two_node_job)


@pytest.mark.subprocess
def test_two_nodes_on_loopback_train_to_the_end_with_identical_weights(two_node_run: Path) -> None:
    _assert_weights(two_node_run, steps=10)
    for rank in range(2):
        assert _records(two_node_run, "steps", rank) == [(0, step) for step in range(1, 11)]
    assert resume.latest(two_node_run / "ckpt") is not None
    assert resume.is_complete_checkpoint(two_node_run / "ckpt" / "last.ckpt")


@pytest.mark.subprocess
def test_a_two_rank_checkpoint_resumes_on_one_device(two_node_run: Path, eager_hpu: hpu.Backend) -> None:
    ckpt = resume.resolve_ckpt_path("last", two_node_run / "ckpt")
    assert ckpt is not None
    model = elastic_fit.TinyModel()
    trainer = Trainer(accelerator="hpu", devices=1, max_steps=12, logger=False, enable_checkpointing=False)
    trainer.fit(model, ckpt_path=ckpt)
    assert trainer.global_step == 12
    restored = torch.load(ckpt, weights_only=False)
    assert restored["global_step"] == 10
    # the optimizer state came along: two more steps on sample 0 alone match a replay from the checkpoint
    net = elastic_fit.make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in restored["state_dict"].items()})
    optimizer = elastic_fit.make_optimizer(net.parameters())
    optimizer.load_state_dict(restored["optimizer_states"][0])
    x, y = elastic_fit.samples()
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x[:1]), y[:1]).backward()
        optimizer.step()
    for name, value in net.state_dict().items():
        torch.testing.assert_close(model.state_dict()[f"net.{name}"], value, rtol=0, atol=1e-6)


#: (attempt, killed rank, step after which it dies); checkpoints every 5 steps, 15 steps in all. One job loses a rank in
#: two attempts in a row (each restart starts both ranks again, so a second job would only add process starts): rank 1
#: dies before the first checkpoint, so the restart starts over from nothing; then rank 0 (the store's host) dies
#: after a checkpoint, so the next restart resumes from it.
KILLS = ((0, 1, 3), (1, 0, 7))


@pytest.mark.subprocess
def test_a_killed_rank_resumes_and_finishes_every_time(tmp_path: Path) -> None:
    """A torchrun job losing a rank mid-epoch in two attempts in a row; it must reach max_steps with the right
    weights, each restart resuming from the newest checkpoint written before its kill."""
    every, max_steps = 5, 15
    out = tmp_path / "job"
    # agents that look every second: the survivor meets the lost peer (the error checked below) before its agent
    # stops it, even on a loaded machine (seen with 4 test workers on 2 cores)
    args = ["--max-steps", str(max_steps), "--every", str(every)]
    args += [arg for attempt, rank, step in KILLS for arg in ("--kill", f"{attempt}:{rank}:{step}")]
    codes, log = run_two_node_job(out, *args, monitor_interval=1.0)
    assert codes == [0, 0], f"the job (ranks killed: {KILLS}) failed:\n{log[-8000:]}"
    # the survivor's error names the failed collective, the lost peer and the timeout, unless its agent, restarting
    # the job, stopped it first: a race torchrun decides (the error itself: test_collective_faults, test_errors)
    lost = log.count("PeerLostError: Rank ")
    if lost:
        assert "failed: a peer process died (its connection closed" in log
        assert "timeout=0:00:20, set by HPUParallelStrategy(timeout=...)" in log
    if lost < len(KILLS):
        assert "closing signal SIGTERM" in log, log[-8000:]
    assert "CollectiveTimeoutError" not in log, log[-8000:]  # no rank waited out the timeout (the stop vote did)
    _assert_weights(out, max_steps)  # so every step was applied exactly once, on both ranks
    for r in range(2):
        starts = _records(out, "resumed", r)
        steps = _records(out, "steps", r)
        assert starts[0] == (0, 0)
        for attempt, rank, step in KILLS:
            if rank == r:
                assert max(s for a, s in steps if a == attempt) == step, (attempt, steps)
            expected_resume = step // every * every  # the newest checkpoint written before the kill
            assert starts[attempt + 1] == (attempt + 1, expected_resume), (KILLS, starts)
        for attempt, resumed_at in starts:
            done = [s for a, s in steps if a == attempt]
            assert done == list(range(resumed_at + 1, resumed_at + 1 + len(done))), (attempt, done)
        assert max(s for a, s in steps if a == starts[-1][0]) == max_steps


@pytest.mark.subprocess
def test_a_hung_peer_ends_in_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    """Rank 1 stops answering before a barrier: rank 0 fails after timeout=10s, naming it; the job ends. (The timeout
    bounds the process group's forming too: with 5 s, rank 0 once started more than that after rank 1 on a loaded
    machine.)"""
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "0", "--monitor-interval", "0.2", str(FIT), str(out)]
    cmd += ["--num-nodes", "1", "--devices", "2", "--hang-rank", "1", "--timeout", "10"]
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    ended = time.time()
    log = result.stdout + result.stderr
    assert result.returncode != 0
    expected = "CollectiveTimeoutError: Rank 0/2: barrier 'recorder' failed: a peer process did not answer within"
    assert expected in log, log[-6000:]
    assert "within timeout=0:00:10" in log
    assert "PeerLostError" not in log
    waited = ended - (out / "resumed-rank0.txt").stat().st_mtime  # rank 0 wrote it just before the barrier
    assert 10 <= waited < 10 + 30, waited  # the full timeout, then a prompt end (the hung rank within its grace period)


def _kill_during_save(path: Path, mode: str, megabytes: int = 256) -> None:
    """Starts ``big_save.py`` and SIGKILLs it once the file being written holds 16 MB."""
    proc = subprocess.Popen([sys.executable, str(HELPERS / "big_save.py"), str(path), mode, str(megabytes)])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if any(p.stat().st_size > 16 * 2**20 for p in path.parent.iterdir()):
                break
            assert proc.poll() is None, "the save finished before it could be interrupted"
            time.sleep(0.002)
        else:
            pytest.fail("the save never started writing")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _step(path: Path) -> int:
    return int(torch.load(path, weights_only=True)["global_step"])


@pytest.mark.subprocess
def test_a_save_killed_half_way_never_leaves_a_truncated_checkpoint(tmp_path: Path) -> None:
    atomic = tmp_path / "atomic" / "last.ckpt"
    atomic.parent.mkdir()
    torch.save({"global_step": 1}, atomic)  # the previous complete "last"
    _kill_during_save(atomic, "atomic")
    assert _step(atomic) == 1  # still the old, complete checkpoint
    leftovers = [p for p in atomic.parent.iterdir() if p != atomic]
    assert leftovers, "the kill should have caught the temporary file"
    assert all(p.name.startswith(".last.ckpt.") and p.suffix == ".tmp" for p in leftovers)
    assert resume.resolve_ckpt_path("last", atomic.parent) == str(atomic)
    assert resume.resolve_ckpt_path("auto", atomic.parent) == str(atomic)
    # the same kill against a plain torch.save leaves a truncated file under the final name, which resume refuses
    plain = tmp_path / "plain" / "last.ckpt"
    plain.parent.mkdir()
    _kill_during_save(plain, "plain")
    assert plain.exists()
    assert not resume.is_complete_checkpoint(plain)
    with pytest.raises(ValueError, match="is incomplete"):
        resume.resolve_ckpt_path("last", plain.parent)
    assert resume.resolve_ckpt_path("auto", plain.parent) is None


def _fit(trainer_kwargs: dict[str, object], dirpath: Path, max_steps: int, ckpt: str | None) -> Trainer:
    trainer = Trainer(
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=dirpath, filename="{step}", save_last=True)],
        **trainer_kwargs,  # type: ignore[arg-type]
    )
    trainer.fit(elastic_fit.TinyModel(), ckpt_path=ckpt)
    return trainer


def _tensor_devices(checkpoint: object) -> set[str]:
    if isinstance(checkpoint, torch.Tensor):
        return {checkpoint.device.type}
    if isinstance(checkpoint, dict):
        return set().union(*(_tensor_devices(v) for v in checkpoint.values())) if checkpoint else set()
    if isinstance(checkpoint, (list, tuple)):
        return set().union(*(_tensor_devices(v) for v in checkpoint)) if checkpoint else set()
    return set()


def test_a_checkpoint_moves_from_emulated_hpu_to_cpu_and_back(
    tmp_path: Path, clean_hpu_env: pytest.MonkeyPatch
) -> None:
    """Lazy emulation keeps tensors on torch's "lazy" device; the checkpoint still holds CPU tensors only."""
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "lazy")
    _fit({"accelerator": "hpu", "devices": 1}, tmp_path, max_steps=2, ckpt=None)
    first = resume.resolve_ckpt_path("last", tmp_path)
    assert first is not None
    saved = torch.load(first, map_location=None, weights_only=False)
    assert _tensor_devices(saved) == {"cpu"}
    assert saved["global_step"] == 2
    clean_hpu_env.delenv(hpu.EMULATE_ENV)
    hpu._backends.clear()
    cpu = _fit({"accelerator": "cpu", "devices": 1}, tmp_path, max_steps=4, ckpt=first)
    assert cpu.global_step == 4
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    hpu._backends.clear()
    back = _fit({"accelerator": "hpu", "devices": 1}, tmp_path, max_steps=6, ckpt=resume.latest(tmp_path))
    assert back.global_step == 6
    assert torch.load(resume.latest(tmp_path), weights_only=False)["global_step"] == 6
