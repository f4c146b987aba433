"""One live job per checkpoint folder: the lock file, its takeover from a holder that is gone, and a fit refused on a
folder a live job holds (before any step or write)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.models import trainer_kwargs
from helpers.workload import Workload, loader
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks.test_preemption import SIGTERM_EXIT, whole_job
from lightning_gaudi.callbacks import PreemptionCheckpoint
from lightning_gaudi.callbacks.checkpoint_lock import (
    LOCK_FILENAME,
    CheckpointFolderLock,
    CheckpointLock,
    FolderLockedError,
)


def _plant(folder: Path, host: str, pid: int, age: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILENAME
    path.write_text(json.dumps({"host": host, "pid": pid, "started": time.time() - age}))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_lock_names_its_holder_beats_and_is_released(tmp_path: Path) -> None:
    lock = CheckpointFolderLock(str(tmp_path / "ckpt"), heartbeat=0.05)
    lock.acquire()
    path = tmp_path / "ckpt" / LOCK_FILENAME
    holder = json.loads(path.read_text())
    assert (holder["host"], holder["pid"]) == (socket.gethostname(), os.getpid())
    os.utime(path, (0, 0))
    time.sleep(0.3)
    assert path.stat().st_mtime > time.time() - 5  # the heartbeat refreshed it
    lock.release()
    assert not path.exists()


@pytest.mark.subprocess
def test_a_lock_whose_holder_is_gone_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _plant(tmp_path / "a", socket.gethostname(), _dead_pid())
    _plant(tmp_path / "b", "another-host", 1, age=3600)
    for folder in ("a", "b"):
        lock = CheckpointFolderLock(str(tmp_path / folder))
        lock.acquire()
        assert json.loads((tmp_path / folder / LOCK_FILENAME).read_text())["pid"] == os.getpid()
        lock.release()
    warnings = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(warnings) == 2
    assert "no process" in warnings[0]
    assert "heartbeat is 3600 s old" in warnings[1]


def test_a_taker_that_finds_another_takers_new_lock_puts_it_back_and_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _plant(tmp_path, "another-host", 1, age=3600)
    rename = os.rename

    def late(source: str, target: str) -> None:  # the other taker replaced the stale lock between read and rename
        _plant(tmp_path, socket.gethostname(), os.getppid())
        monkeypatch.setattr(os, "rename", rename)
        rename(source, target)

    monkeypatch.setattr(os, "rename", late)
    with pytest.raises(FolderLockedError, match=f"pid {os.getppid()}"):
        CheckpointFolderLock(str(tmp_path)).acquire()
    assert json.loads(path.read_text())["pid"] == os.getppid()
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_FILENAME]


def test_an_unreadable_lock_is_judged_by_its_age(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILENAME
    path.write_text("[1, 2")  # a holder killed while writing it
    with pytest.raises(FolderLockedError, match="an unreadable lock file, last written 0 s ago"):
        CheckpointFolderLock(str(tmp_path)).acquire()
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    lock = CheckpointFolderLock(str(tmp_path))
    lock.acquire()
    lock.release()
    assert not path.exists()


def test_a_live_holder_refuses_naming_the_folder_and_the_holder(tmp_path: Path) -> None:
    _plant(tmp_path / "a", socket.gethostname(), os.getppid())  # alive on this host
    _plant(tmp_path / "b", "another-host", 4242, age=5)  # a fresh heartbeat from another host
    for folder, holder in (("a", f"pid {os.getppid()}"), ("b", "'another-host', pid 4242")):
        with pytest.raises(FolderLockedError, match="in use by another live job") as error:
            CheckpointFolderLock(str(tmp_path / folder)).acquire()
        assert str(tmp_path / folder) in str(error.value)
        assert holder in str(error.value)


class _Steps(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_start(self, *args: object) -> None:
        self.steps += 1


@pytest.mark.usefixtures("eager_hpu")
def test_a_second_job_on_a_live_folder_is_refused_before_training(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _plant(folder, socket.gethostname(), os.getppid())
    steps = _Steps()
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=1), steps],
        **trainer_kwargs(enable_checkpointing=True),
    )
    with pytest.raises(FolderLockedError, match=str(folder)):
        trainer.fit(Workload(), loader(4))
    preempted_into = tmp_path / "preempted"  # the preemption checkpoint's own folder is locked too
    _plant(preempted_into, socket.gethostname(), os.getppid())
    trainer = Trainer(
        accelerator="hpu", devices=1, callbacks=[PreemptionCheckpoint(dirpath=str(preempted_into))], **trainer_kwargs()
    )
    with pytest.raises(FolderLockedError, match=str(preempted_into)):
        trainer.fit(Workload(), loader(4))
    assert steps.steps == 0
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILENAME]
    trainer.test(Workload(), loader(2))  # writes nothing: no lock needed


@pytest.mark.usefixtures("eager_hpu")
def test_fit_then_test_is_one_job_and_the_lock_is_released_at_the_end(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=1)],
        **trainer_kwargs(enable_checkpointing=True),
    )
    trainer.fit(Workload(), loader(4))
    trainer.test(ckpt_path="best", dataloaders=loader(2))
    trainer.fit(Workload(), loader(4))  # the same process again: the lock was released
    assert not (folder / LOCK_FILENAME).exists()
    assert [p.name for p in folder.iterdir()] == ["epoch=0-step=2.ckpt"]


@pytest.mark.subprocess
def test_a_second_two_card_job_is_refused_and_the_first_releases_the_folder_when_preempted(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The 2-card job of ``test_sigterm_to_the_whole_job_saves_a_checkpoint_and_ends_every_rank``: while it trained, a
    second job was started on its checkpoint folder; then the job was preempted."""
    out, end = whole_job(tmp_path_factory)
    folder = out / "ckpt"
    first_rank_0 = end["pids"][0]
    holder = end["holder"]
    assert (holder["host"], holder["pid"]) == (socket.gethostname(), first_rank_0)  # global rank 0
    second = end["second"]
    assert second["returncode"] != 0
    assert f"The checkpoint folder {str(folder)!r} is in use by another live job" in second["stderr"]
    assert f"pid {first_rank_0}" in second["stderr"]
    assert not second["trained"]  # neither rank trained
    assert second["folder"] == [LOCK_FILENAME]  # nor wrote there
    assert end["returncode"] == SIGTERM_EXIT, end["log"][-4000:]
    assert end["ckpt"] == ["last-preempted.ckpt"]  # the lock released at the exit


@pytest.mark.parametrize(("heartbeat", "stale_after"), [(0, 60), (10, 10), (30, 20)])
def test_a_heartbeat_not_below_the_stale_bound_is_refused(heartbeat: float, stale_after: float) -> None:
    with pytest.raises(ValueError, match="needs 0 < heartbeat < stale_after"):
        CheckpointLock(heartbeat=heartbeat, stale_after=stale_after)
