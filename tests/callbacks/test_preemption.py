"""Preemption (``PreemptionCheckpoint``): SIGTERM saves a checkpoint at a step all ranks agree on and stops every rank
within the grace period, under Lightning's launcher, under torchrun, and on one device.

The jobs run ``tests/reliability_helpers/preempt_fit.py`` (eager emulation, a tiny model). Each process that imports
Lightning costs seconds of CPU, so a job several tests can read runs once (:func:`signal_job` with ``run_once``): the
whole-job SIGTERM job also serves ``test_checkpoint_lock``, the ``hpu_fsdp`` job the one-rank SIGTERM test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.shared_job import run_once
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_gaudi import hpu, resume
from lightning_gaudi.callbacks import PreemptionCheckpoint
from lightning_gaudi.callbacks.checkpoint_lock import LOCK_FILENAME
from lightning_gaudi.callbacks.preemption import Preempted, add_default_preemption, preempted_exit_code
from lightning_gaudi.distributed import agreement
from lightning_gaudi.patches import signals as signals_patch

HELPERS = Path(__file__).parents[1] / "reliability_helpers"
FIT = HELPERS / "preempt_fit.py"
sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))
from models import RegressionModel, regression_loader, trainer_kwargs  # noqa: E402

#: A DeepSpeed rank's first import on a fresh, loaded 2-core machine took longer than 90 s in CI.
START_TIMEOUT_S = 240
SIGTERM_EXIT = 128 + signal.SIGTERM
#: How long past its grace period a job may take to be gone: a rank's timer starts when its main thread next runs
#: Python after the signal, and ``end_job`` then waits up to 5 s for the ranks it started. A loaded CI machine
#: (three workers on two cores) took an FSDP job that exits 6 s after SIGTERM on an idle one past 20 s.
EXIT_ALLOWANCE_S = 10.0
#: The grace period of the jobs several tests read (:func:`signal_job`).
GRACE_S = 20.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "LIGHTNING_GAUDI_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        env.pop(name, None)
    env.update({hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


class Job:
    """A preempt_fit.py job in its own session, with the pids its ranks wrote."""

    def __init__(self, out: Path, *args: str, torchrun: bool = False, ranks: int = 2) -> None:
        self.out = out
        self.ranks = ranks
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(FIT), str(out), *args]
        if torchrun:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            command += ["--monitor-interval", "0.2", str(FIT), str(out), "--torchrun", *args]
        self.log = out / "job.log"
        self.pids: list[int] = []
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                command, env=_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pids = self._wait_for_pids()

    def _wait_for_pids(self) -> list[int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        files = [self.out / f"rank{rank}.pid" for rank in range(self.ranks)]
        steps = [self.out / f"rank{rank}.step" for rank in range(self.ranks)]
        while not all(f.is_file() and f.read_text() for f in files + steps):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the job did not start training\n{self.log.read_text()[-5000:]}")
            time.sleep(0.1)
        return [int(f.read_text()) for f in files]

    def alive(self) -> list[int]:
        """The job's processes still running (a process that exited but was not reaped yet is not)."""
        self.proc.poll()
        alive = []
        for pid in {self.proc.pid, *self.pids}:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if state not in ("Z", "X"):
                alive.append(pid)
        return alive

    def wait_gone(self, within: float) -> float:
        """Seconds until every process of the job is gone; fails (after killing them) past ``within``."""
        start = time.monotonic()
        while self.alive():
            if time.monotonic() - start > within:
                self.kill()
                pytest.fail(f"processes still running {within}s after the signal\n{self.log.read_text()[-5000:]}")
            time.sleep(0.05)
        took = time.monotonic() - start
        self.proc.wait()  # exited already; reaps it and sets its return code
        return took

    def kill(self) -> None:
        for pid in [*self.pids]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    @property
    def checkpoint(self) -> Path:
        return self.out / "ckpt" / "last-preempted.ckpt"


def signal_job(
    out: Path, *args: str, rank: int | None = None, meanwhile: Callable[[Job], dict[str, Any]] | None = None
) -> None:
    """Starts a 2-rank ``Job`` in ``out`` with a grace period of :data:`GRACE_S`, runs ``meanwhile`` on it while it
    trains, sends SIGTERM to the whole job (``rank`` None) or to rank ``rank`` alone, waits (at most the grace period
    and :data:`EXIT_ALLOWANCE_S`) until every process is gone, and records how it ended in ``out/ended.json`` (with
    what ``meanwhile`` returned): a job several tests read through ``run_once``, each checking its own claims."""
    job = Job(out, "--grace", str(GRACE_S), *args)
    try:
        facts = meanwhile(job) if meanwhile is not None else {}
    except BaseException:
        job.kill()
        raise
    if rank is None:
        os.killpg(job.proc.pid, signal.SIGTERM)  # what a scheduler does: every process of the job
    else:
        os.kill(job.pids[rank], signal.SIGTERM)
    took = job.wait_gone(within=GRACE_S + EXIT_ALLOWANCE_S)
    ckpt = sorted(p.name for p in (out / "ckpt").iterdir()) if (out / "ckpt").exists() else []
    ended = {"returncode": job.proc.returncode, "took": took, "pids": job.pids, "ckpt": ckpt, **facts}
    (out / "ended.json").write_text(json.dumps(ended))


def ended(out: Path) -> dict[str, Any]:
    """What :func:`signal_job` recorded, with the job's log (``log``) and the step each rank stopped after
    (``steps``)."""
    facts = json.loads((out / "ended.json").read_text())
    facts["log"] = (out / "job.log").read_text()
    facts["steps"] = {int((out / f"rank{rank}.step").read_text()) for rank in range(2)}
    return facts


def _second_job_on_its_folder(job: Job) -> dict[str, Any]:
    """For ``test_checkpoint_lock``: the lock's holder while the job trains, and how a second job started on the job's
    checkpoint folder ended (its stderr, whether a rank trained, the folder meanwhile)."""
    folder = job.out / "ckpt"
    holder = json.loads((folder / LOCK_FILENAME).read_text())
    second_out = job.out / "second"
    second_out.mkdir()
    command = [sys.executable, str(FIT), str(second_out), "--ckpt-dir", str(folder)]
    second = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    return {
        "holder": holder,
        "second": {
            "returncode": second.returncode,
            "stderr": second.stderr,
            "trained": bool(list(second_out.glob("rank*.step"))),
            "folder": sorted(p.name for p in folder.iterdir()),
        },
    }


def _whole_job(out: Path) -> None:
    """A DDP job that takes SIGTERM on every process, after a second job on its checkpoint folder was tried."""
    signal_job(out, meanwhile=_second_job_on_its_folder)


def whole_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The job of ``_whole_job``, run once for this test and ``test_checkpoint_lock``'s second-job test: its folder and
    how it ended."""
    out = run_once(tmp_path_factory, "preempt-whole-job", _whole_job)
    return out, ended(out)


def _assert_resumes(out: Path) -> None:
    """The checkpoint in ``out/ckpt`` verifies, the resume policies pick it, and training goes on from its step on one
    device."""
    checkpoint = out / "ckpt" / "last-preempted.ckpt"
    info = resume.verify_checkpoint(checkpoint)
    assert info.global_step is not None
    assert info.global_step > 0
    ckpt_dir = out / "ckpt"
    assert resume.resolve_ckpt_path("auto", ckpt_dir) == str(checkpoint)
    assert resume.resolve_ckpt_path("last", ckpt_dir) == str(checkpoint)
    model = RegressionModel()
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        default_root_dir=out,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_top_k=0)],
        **trainer_kwargs(max_steps=info.global_step + 2, max_epochs=None, enable_checkpointing=True),
    )
    trainer.fit(model, regression_loader(), ckpt_path="last")  # Lightning's own "last" finds it too
    assert trainer.global_step == info.global_step + 2
    restored = torch.load(checkpoint, weights_only=False)
    assert restored["global_step"] == info.global_step


@pytest.mark.subprocess
def test_sigterm_to_the_whole_job_saves_a_checkpoint_and_ends_every_rank(
    tmp_path_factory: pytest.TempPathFactory, eager_hpu: hpu.Backend
) -> None:
    out, end = whole_job(tmp_path_factory)
    assert end["returncode"] == SIGTERM_EXIT, end["log"][-4000:]
    steps = end["steps"]
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    print(f"2 ranks, SIGTERM to the job: all gone {end['took']:.2f}s after the signal")
    assert not [name for name in end["ckpt"] if name.endswith(".tmp")]
    _assert_resumes(out)  # saves nothing there: test_checkpoint_lock reads what the job left from ended.json
    # the callbacks' batch-end hooks (which stop) run before the model's (which records the step)
    assert resume.read_checkpoint_info(out / "ckpt" / "last-preempted.ckpt").global_step == steps.pop() + 1


def _fsdp_job_signalled_on_rank_1(out: Path) -> None:
    """The ``hpu_fsdp`` job takes SIGTERM on rank 1 alone, with the ranks' torchrun restart counts differing: the
    sharded-strategy test and the one-rank test read it (a whole-job SIGTERM: the other strategies' jobs)."""
    signal_job(out, "--strategy", "hpu_fsdp", "--restart-counts", "0,1", rank=1)


@pytest.mark.subprocess
@pytest.mark.parametrize("strategy", ["hpu_fsdp", "hpu_fsdp_sharded_checkpoint", "hpu_deepspeed_stage_2"])
def test_sigterm_ends_a_sharded_job_as_it_ends_a_ddp_job(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, strategy: str
) -> None:
    """The shared strategy core behaves the same for every distributed strategy: a checkpoint at one step, exit 143
    from every process, none left."""
    if strategy.startswith("hpu_deepspeed"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    if strategy == "hpu_fsdp":
        out = run_once(tmp_path_factory, "preempt-hpu_fsdp-rank1", _fsdp_job_signalled_on_rank_1)
    else:
        out = tmp_path / "job"
        signal_job(out, "--strategy", strategy)
    end = ended(out)
    assert end["returncode"] == SIGTERM_EXIT, end["log"][-4000:]
    steps = end["steps"]
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    checkpoint = out / "ckpt" / "last-preempted.ckpt"
    assert checkpoint.exists(), end["log"][-4000:]
    assert end["ckpt"] == ["last-preempted.ckpt"]
    # a restart continues from it: the resume policies verify the checkpoint (a folder for DeepSpeed) and pick it
    assert resume.verify_checkpoint(checkpoint).global_step == steps.pop() + 1
    assert resume.resolve_ckpt_path("auto", out / "ckpt") == str(checkpoint)
    assert resume.resolve_ckpt_path("last", out / "ckpt") == str(checkpoint)
    print(f"2 ranks of {strategy}, SIGTERM: all gone {end['took']:.2f}s after the signal")


@pytest.mark.subprocess
def test_sigterm_with_preemption_off_ends_every_rank_at_once(tmp_path: Path) -> None:
    """``PreemptionCheckpoint(enabled=False)``: no checkpoint, and no rank keeps training (or hangs) after SIGTERM."""
    job = Job(tmp_path / "job", "--disabled")
    os.killpg(job.proc.pid, signal.SIGTERM)
    took = job.wait_gone(within=10)
    assert job.proc.returncode == -signal.SIGTERM, job.log.read_text()[-4000:]
    assert not job.checkpoint.exists()
    print(f"2 ranks, preemption off, SIGTERM to the job: all gone {took:.2f}s after the signal")


@pytest.mark.subprocess
def test_a_second_sigterm_during_the_exit_keeps_the_preemption_exit_code(tmp_path: Path) -> None:
    job = Job(tmp_path / "job", "--devices", "1", "--linger", "20", ranks=1)
    job.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while not (job.out / "rank0.ended").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job.proc.send_signal(signal.SIGTERM)  # a scheduler's second signal, while the process is exiting
    job.wait_gone(within=5)
    assert job.proc.returncode == SIGTERM_EXIT, job.log.read_text()[-4000:]
    assert resume.verify_checkpoint(job.checkpoint).global_step


@pytest.mark.subprocess
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Also when the ranks' torchrun restart counts differ (two nodes' agents after a peer's restart): the vote's keys
    are the same on every rank all the same. (The ``hpu_fsdp`` job of the sharded-strategy test: the vote is the
    strategies' shared core.)"""
    out = run_once(tmp_path_factory, "preempt-hpu_fsdp-rank1", _fsdp_job_signalled_on_rank_1)
    end = ended(out)  # rank 1 alone got the signal: rank 0 learns it from the vote
    assert end["took"] <= GRACE_S + EXIT_ALLOWANCE_S
    assert end["returncode"] == SIGTERM_EXIT, end["log"][-4000:]
    steps = end["steps"]
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    assert resume.verify_checkpoint(out / "ckpt" / "last-preempted.ckpt").global_step == steps.pop() + 1
    print(f"2 ranks, SIGTERM to rank 1 only: all gone {end['took']:.2f}s after the signal")


@pytest.mark.subprocess
def test_sigterm_after_steps_slowed_down_40x_still_saves_within_the_grace_period(tmp_path: Path) -> None:
    """Steps of 10 ms, then 400 ms from step 20 on (the vote's spacing was set from the fast ones), SIGTERM to rank 1
    only after a few slow steps: both ranks save the preemption checkpoint at one step within the grace period (a vote
    spaced in steps reached rank 0 only ~30 s later, after the 8 s grace period had ended both ranks)."""
    grace = 8.0
    job = Job(
        tmp_path / "job", "--grace", str(grace), "--step-sleep", "0.01", "--slow-after", "20", "--slow-factor", "40"
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while int((job.out / "rank1.step").read_text() or 0) < 23:
        assert time.monotonic() < deadline, job.log.read_text()[-4000:]
        time.sleep(0.05)
    signalled = time.time()
    os.kill(job.pids[1], signal.SIGTERM)
    job.wait_gone(within=grace + 60)  # the interpreter's own exit is slow on a loaded machine
    log = job.log.read_text()
    assert job.proc.returncode == SIGTERM_EXIT, log[-4000:]
    assert "ran out" not in log, log[-4000:]
    saved = [float((job.out / f"rank{rank}.ended").read_text()) - signalled for rank in range(2)]
    assert max(saved) < grace, (saved, log[-4000:])
    steps = {int((job.out / f"rank{rank}.step").read_text()) for rank in range(2)}
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    assert resume.verify_checkpoint(job.checkpoint).global_step == steps.pop() + 1
    print(f"2 ranks, steps slowed 40x, SIGTERM to rank 1: both saved and out of fit {max(saved):.2f}s after it")


@pytest.mark.subprocess
def test_a_grace_period_too_short_ends_every_rank_without_a_partial_checkpoint(tmp_path: Path) -> None:
    grace = 2.0
    job = Job(tmp_path / "job", "--grace", str(grace), "--slow-save", "30")
    os.killpg(job.proc.pid, signal.SIGTERM)
    took = job.wait_gone(within=grace + 8)  # the grace period, then the interpreter's exit on a busy machine
    assert job.proc.returncode == SIGTERM_EXIT, job.log.read_text()[-4000:]
    assert "grace period of 2s ran out while saving" in job.log.read_text()
    leftovers = sorted(p.name for p in (job.out / "ckpt").iterdir()) if (job.out / "ckpt").exists() else []
    assert leftovers == [], f"a grace period that ran out left {leftovers}"
    print(f"2 ranks, grace period 2 s, a 30 s save: all gone {took:.2f}s after the signal")


@pytest.mark.subprocess
def test_sigterm_to_all_torchrun_agents_saves_and_ends_every_rank(tmp_path: Path) -> None:
    grace = 15.0
    job = Job(tmp_path / "job", "--grace", str(grace), torchrun=True)
    os.killpg(job.proc.pid, signal.SIGTERM)  # the agent and its workers, as a scheduler signals a job step
    job.wait_gone(within=grace + 5)
    log = job.log.read_text()
    assert job.proc.returncode != 0, log[-4000:]  # the agent reports the signal it got
    assert "preempted by SIGTERM: saved" in log, log[-4000:]
    assert resume.verify_checkpoint(job.checkpoint).global_step


@pytest.mark.subprocess
def test_sigterm_on_one_device_saves_and_stops(tmp_path: Path, eager_hpu: hpu.Backend) -> None:
    grace = 20.0
    job = Job(tmp_path / "job", "--devices", "1", "--grace", str(grace), ranks=1)
    job.proc.send_signal(signal.SIGTERM)
    job.wait_gone(within=grace + EXIT_ALLOWANCE_S)
    assert job.proc.returncode == SIGTERM_EXIT, job.log.read_text()[-4000:]
    _assert_resumes(job.out)


# ----------------------------------------------------------------------------------------------------------------------
# In one process
# ----------------------------------------------------------------------------------------------------------------------


class SignalsItself(RegressionModel):
    """Sends ``signum`` to its own process after batch ``at``."""

    def __init__(self, signum: int, at: int = 2) -> None:
        super().__init__()
        self.signum = signum
        self.at = at

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if batch_idx == self.at:
            os.kill(os.getpid(), self.signum)


def _fit_until_preempted(tmp_path: Path, callback: PreemptionCheckpoint, signum: int) -> tuple[Trainer, Preempted]:
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        callbacks=[callback, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=0)],
        **trainer_kwargs(max_steps=20, enable_checkpointing=True),
    )
    previous = {sig: signal.getsignal(sig) for sig in callback.signals}
    try:
        with pytest.raises(Preempted) as raised:
            trainer.fit(SignalsItself(signum), regression_loader())
        # the process is exiting now: a repeated signal ends it at once with the same exit code, not by the signal
        for sig in callback.signals:
            assert getattr(signal.getsignal(sig), "__qualname__", "") == "exit_on_repeat.<locals>.end", sig
    finally:
        if callback._timer is not None:
            callback._timer.cancel()  # this process goes on: the grace period's exit must not end pytest
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return trainer, raised.value


def test_preempted_in_process_saves_at_the_next_step_and_exits_with_128_plus_the_signal(
    tmp_path: Path, eager_hpu: hpu.Backend
) -> None:
    callback = PreemptionCheckpoint(grace_period=60)
    trainer, raised = _fit_until_preempted(tmp_path, callback, signal.SIGTERM)
    assert raised.code == SIGTERM_EXIT == preempted_exit_code(signal.SIGTERM)
    assert raised.checkpoint == str(tmp_path / "ckpt" / "last-preempted.ckpt")
    assert trainer.global_step == 4  # signalled after the third batch, stopped at the end of the fourth
    assert resume.verify_checkpoint(raised.checkpoint).global_step == 4
    assert not trainer.received_sigterm  # Lightning's own handling never saw it


def test_sigusr1_preempts_when_asked(tmp_path: Path, eager_hpu: hpu.Backend) -> None:
    callback = PreemptionCheckpoint(grace_period=60, signals=["SIGTERM", "USR1"], dirpath=str(tmp_path / "elsewhere"))
    previous = signal.getsignal(signal.SIGUSR1)
    _, raised = _fit_until_preempted(tmp_path, callback, signal.SIGUSR1)
    assert raised.code == 128 + signal.SIGUSR1
    assert raised.checkpoint == str(tmp_path / "elsewhere" / "last-preempted.ckpt")
    assert resume.is_complete_checkpoint(raised.checkpoint)
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_the_hpu_strategies_add_one_by_default_and_a_configured_one_wins(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=1))
    trainer.fit(RegressionModel(), regression_loader())
    assert sum(isinstance(c, PreemptionCheckpoint) for c in trainer.callbacks) == 1
    off = PreemptionCheckpoint(enabled=False)
    trainer = Trainer(accelerator="hpu", devices=1, callbacks=[off], **trainer_kwargs(max_steps=1))
    assert add_default_preemption(trainer) is None
    trainer.fit(RegressionModel(), regression_loader())
    assert [c for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint)] == [off]


def test_preemption_off_leaves_lightnings_per_batch_broadcast_off(eager_hpu: hpu.Backend) -> None:
    seen: list[object] = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer: Trainer, *args: object) -> None:
            seen.append(vars(trainer.fit_loop.epoch_loop).get("_broadcast_sigterm_tensor"))
            seen.append(vars(trainer._signal_connector).get("_sigterm_notifier_fn"))

    off = PreemptionCheckpoint(enabled=False)
    trainer = Trainer(accelerator="hpu", devices=1, callbacks=[off, Probe()], **trainer_kwargs(max_steps=1))
    trainer.fit(RegressionModel(), regression_loader())
    skipped, handler = seen
    assert skipped is signals_patch._skip, "Lightning's per-batch SIGTERM broadcast is back"
    assert handler == off._end  # what Lightning registers for SIGTERM: end every rank at once, without a checkpoint
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)  # released after the fit


def _vote_ranks(
    latency: float, step_times: list[list[float]], signal_at: tuple[int, int]
) -> tuple[list[int], list[float], float]:
    """Two ranks voting on one in-memory store, each training loop a thread whose n-th step takes
    ``step_times[rank][n]`` seconds; rank ``signal_at[0]`` gets SIGTERM after step ``signal_at[1]``. Returns the step
    each rank stopped after, when, and when the signal came."""
    store = torch.distributed.HashStore()
    votes = [agreement.StopVote(timedelta(seconds=30), latency=latency) for _ in range(2)]
    stopped: list[int] = [0, 0]
    when = [0.0, 0.0]
    signalled = [0.0]
    for rank, vote in enumerate(votes):
        vote.start(store, rank, 2, "test")

    def train(rank: int) -> None:
        request = 0
        for step, seconds in enumerate(step_times[rank], 1):
            time.sleep(seconds)
            if (rank, step) == signal_at:
                request = signal.SIGTERM
                signalled[0] = time.monotonic()
            if votes[rank].step(request):
                stopped[rank], when[rank] = step, time.monotonic()
                break
        votes[rank].close()

    threads = [threading.Thread(target=train, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return stopped, when, signalled[0]


def test_the_vote_stops_every_rank_at_one_step_within_the_latency_when_steps_slow_down() -> None:
    """The vote is spaced in time: steps of 5 ms (a step count fixed from them spaced votes 200 steps apart, 40 s of
    the slow steps), then 200 ms (40x); a request on one rank stops both at the same step within ``latency`` of the
    signal (plus the step in progress)."""
    latency = 2.0
    fast, slow = 0.005, 0.2
    times = [[fast] * 200 + [slow] * 60 for _ in range(2)]
    stopped, when, signalled = _vote_ranks(latency, times, signal_at=(1, 203))
    assert stopped[0] == stopped[1] > 203, stopped
    # within the latency on an idle machine (2.2 s); the bound leaves room for a loaded one and still fails the old
    # step-count spacing, which answered 200 slow steps (40 s) later
    assert max(when) - signalled < 3 * latency + slow, (when, signalled)


def test_the_vote_lets_no_rank_pass_the_agreed_step_when_one_rank_is_far_behind() -> None:
    """Rank 0 steps 20x faster than rank 1 (no collective keeps them in step): both still stop at the same step."""
    times = [[0.001] * 3000, [0.02] * 3000]
    stopped, _, _ = _vote_ranks(0.4, times, signal_at=(0, 30))
    assert stopped[0] == stopped[1] > 0, stopped


def test_the_vote_needs_no_extra_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vote travels over the job's rendezvous store: it forms no process group (no gloo on an HCCL job)."""
    formed: list[object] = []
    monkeypatch.setattr(agreement.dist, "new_group", lambda *a, **k: formed.append(k))
    stopped, _, _ = _vote_ranks(0.2, [[0.005] * 400, [0.005] * 400], signal_at=(0, 10))
    assert stopped[0] == stopped[1] > 10
    assert not formed


def test_a_rank_that_ends_first_does_not_hold_the_others() -> None:
    """A rank whose loop ended (a shorter epoch) leaves the vote; the other keeps training and is not held."""
    start = time.monotonic()
    stopped, _, _ = _vote_ranks(0.2, [[0.005] * 10, [0.005] * 200], signal_at=(9, 9))
    assert stopped == [0, 0]
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"grace_period": 0}, "positive, finite"),
        ({"grace_period": float("nan")}, "positive, finite"),
        ({"grace_period": float("inf")}, "positive, finite"),
        ({"grace_period": "30"}, "number of seconds"),
        ({"signals": ["SIGKILL"]}, "no process can catch it"),
        ({"signals": ["SIGNOPE"]}, "not a signal"),
        ({"signals": []}, "handles nothing"),
        ({"filename": "a/b"}, "without a folder"),
        ({"filename": ""}, "without a folder"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PreemptionCheckpoint(**kwargs)  # type: ignore[arg-type]
