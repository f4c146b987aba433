"""Resume policy, the restart-proof process-group handshake and collective error messages, in one process."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from lightning_gaudi import HPUParallelStrategy, hpu, resume
from lightning_gaudi.checkpoint_io import atomic_torch_save
from lightning_gaudi.strategies._process_group import (
    CollectiveTimeoutError,
    collective_errors,
    join_generation,
)


def _save(path: Path, step: int, mtime: float) -> Path:
    atomic_torch_save({"global_step": step, "w": torch.arange(1000.0)}, path)
    os.utime(path, (mtime, mtime))
    return path


def _truncate(source: Path, target: Path, mtime: float) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    os.utime(target, (mtime, mtime))
    return target


def test_complete_and_truncated_checkpoints(tmp_path: Path) -> None:
    whole = _save(tmp_path / "a.ckpt", 1, 1000)
    half = _truncate(whole, tmp_path / "b.ckpt", 2000)
    assert resume.is_complete_checkpoint(whole)
    assert not resume.is_complete_checkpoint(half)
    assert not resume.is_complete_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert not resume.is_complete_checkpoint(tmp_path / "empty.ckpt")
    os.symlink("gone.ckpt", tmp_path / "dangling.ckpt")
    assert not resume.is_complete_checkpoint(tmp_path / "dangling.ckpt")


def test_auto_picks_the_newest_complete_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert resume.resolve_ckpt_path("auto", tmp_path / "not-yet") is None  # first run: start fresh
    assert resume.resolve_ckpt_path("auto", tmp_path) is None
    old = _save(tmp_path / "step=5.ckpt", 5, 1000)
    new = _save(tmp_path / "step=10.ckpt", 10, 2000)
    _truncate(new, tmp_path / "step=15.ckpt", 3000)  # newest, but cut short
    (tmp_path / ".step=20.ckpt.abc.tmp").write_bytes(b"partial")  # what an interrupted atomic save leaves
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(new)
    assert "skipping incomplete checkpoint" in caplog.text
    assert resume.latest(tmp_path) == str(new)
    os.utime(old, (4000, 4000))
    assert resume.latest(tmp_path) == str(old)


def test_last_policy(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no last.ckpt in .*save_last=True.*'auto'"):
        resume.resolve_ckpt_path("last", tmp_path)
    target = _save(tmp_path / "step=10.ckpt", 10, 1000)
    os.symlink(target.name, tmp_path / "last.ckpt")  # ModelCheckpoint(save_last="link")
    assert resume.resolve_ckpt_path("last", tmp_path) == str(tmp_path / "last.ckpt")
    _save(tmp_path / "last-v1.ckpt", 12, 2000)
    assert resume.resolve_ckpt_path("last", tmp_path) == str(tmp_path / "last-v1.ckpt")
    _truncate(target, tmp_path / "last-v1.ckpt", 3000)
    with pytest.raises(ValueError, match=r"last-v1.ckpt' is incomplete"):
        resume.resolve_ckpt_path("last", tmp_path)


def test_explicit_paths_and_bad_input(tmp_path: Path) -> None:
    assert resume.resolve_ckpt_path(None, tmp_path) is None
    whole = _save(tmp_path / "x.ckpt", 1, 1000)
    assert resume.resolve_ckpt_path(whole) == str(whole)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        resume.resolve_ckpt_path(tmp_path / "nope.ckpt")
    with pytest.raises(ValueError, match=r"is incomplete"):
        resume.resolve_ckpt_path(_truncate(whole, tmp_path / "y.ckpt", 1))
    with pytest.raises(ValueError, match=r"policy 'auto' .* no `dirpath`"):
        resume.resolve_ckpt_path("auto")
    with pytest.raises(NotADirectoryError, match=r"is a file"):
        resume.latest(whole)


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _join(store: dist.TCPStore, rank: int, world: int, timeout: float, out: dict[int, object], delay: float) -> None:
    time.sleep(delay)
    try:
        out[rank] = join_generation(store, rank, world, timedelta(seconds=timeout))
    except Exception as err:
        out[rank] = err


def _run(store: dist.TCPStore, world: int, delays: dict[int, float], timeout: float = 10) -> dict[int, object]:
    out: dict[int, object] = {}
    threads = [threading.Thread(target=_join, args=(store, r, world, timeout, out, d)) for r, d in delays.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def test_restarted_ranks_ignore_what_dead_ones_left_in_the_store(store: dist.TCPStore) -> None:
    first = _run(store, 3, {0: 0.0, 1: 0.0, 2: 0.0})
    assert len(set(first.values())) == 1
    assert isinstance(first[0], str)
    # the next attempt: ranks 1 and 2 start before rank 0, while the dead round's generation and welcomes remain
    second = _run(store, 3, {0: 0.5, 1: 0.0, 2: 0.1})
    assert len(set(second.values())) == 1
    assert isinstance(second[0], str)
    assert second[0] != first[0]


def test_a_rank_that_never_joins_ends_in_a_clear_error(store: dist.TCPStore) -> None:
    started = time.monotonic()
    out = _run(store, 2, {0: 0.0}, timeout=0.5)
    assert time.monotonic() - started < 5
    assert isinstance(out[0], CollectiveTimeoutError)
    assert "did not form within timeout=0:00:00.500000: rank(s) [1] never joined" in str(out[0])
    out = _run(store, 2, {1: 0.0}, timeout=0.5)  # the stale generation of the round above has no live rank 0
    assert isinstance(out[1], CollectiveTimeoutError)
    assert "rank 0 never answered" in str(out[1])


def test_collective_errors_name_the_timeout() -> None:
    expected = r"barrier failed: .* within timeout=0:00:20\. Restart"
    with (
        pytest.raises(CollectiveTimeoutError, match=expected) as info,
        collective_errors("barrier", timedelta(seconds=20)),
    ):
        raise RuntimeError("[gloo] Connection closed by peer")
    assert isinstance(info.value.__cause__, RuntimeError)
    own_error = r"^mat1 and mat2 shapes cannot be multiplied$"
    with (
        pytest.raises(RuntimeError, match=own_error),
        collective_errors("bw", timedelta(seconds=2), transport_only=True),
    ):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (
            RuntimeError("[gloo] Connection closed by peer"),
            r"backward \(gradient all-reduce\) failed: .*timeout=0:00:05",
        ),
        (RuntimeError("element 0 of tensors does not require grad"), r"^element 0 of tensors does not require grad$"),
    ],
)
def test_backward_names_a_dead_peer_and_passes_its_own_errors(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, raised: RuntimeError, expected: str
) -> None:
    """A gradient all-reduce whose peer died fails naming the timeout; backward's own errors pass unchanged."""

    def backward(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(DDPStrategy, "backward", backward)
    strategy = HPUParallelStrategy(timeout=5)
    with pytest.raises(RuntimeError, match=expected) as info:
        strategy.backward(torch.zeros(()), None)
    transport = "gloo" in str(raised)
    assert isinstance(info.value, CollectiveTimeoutError) is transport
    assert (info.value.__cause__ is raised) is transport
