"""Resume policy, in one process: which checkpoint each policy picks, and how damaged checkpoints are handled.

The restart-proof process-group handshake and the collective errors are tested in ``tests/distributed/``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.serialization import config as serialization_config

from lightning_gaudi import resume
from lightning_gaudi.checkpoint_io import HPUCheckpointIO, atomic_torch_save
from lightning_gaudi.strategies import _staged
from lightning_gaudi.strategies._staged import save_sharded_checkpoint, save_staged


def _save(path: Path, step: int, mtime: float, epoch: int = 0) -> Path:
    atomic_torch_save({"global_step": step, "epoch": epoch, "w": torch.arange(100_000.0) + step}, path)
    os.utime(path, (mtime, mtime))
    return path


def _zero_the_middle(source: Path, target: Path, mtime: float) -> Path:
    """What an interrupted copy into a preallocated (or sparse) file leaves: the right size, zeros inside."""
    data = bytearray(source.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)
    target.write_bytes(bytes(data))
    os.utime(target, (mtime, mtime))
    return target


def _break_the_pickle(source: Path, target: Path, mtime: float) -> Path:
    """A valid zip (every CRC-32 right) whose data.pkl stops half-way: torch.load fails on it."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for member in src.infolist():
            payload = src.read(member)
            if member.filename.endswith("/data.pkl"):
                payload = payload[: len(payload) // 2]
            dst.writestr(member, payload)
    os.utime(target, (mtime, mtime))
    return target


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
    _save(tmp_path / "step=5.ckpt", 5, 1000)
    new = _save(tmp_path / "step=10.ckpt", 10, 2000)
    _truncate(new, tmp_path / "step=15.ckpt", 3000)  # newest, but cut short
    (tmp_path / ".step=20.ckpt.abc.tmp").write_bytes(b"partial")  # what an interrupted atomic save leaves
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(new)
    assert "skipped 1 checkpoint(s) that failed verification" in caplog.text
    assert f"{tmp_path / 'step=15.ckpt'} (incomplete" in caplog.text
    assert resume.latest(tmp_path) == str(new)


def test_newest_is_the_highest_recorded_step_not_the_newest_file(tmp_path: Path) -> None:
    """``touch`` (or a copy without -p) makes an old checkpoint the newest file; the recorded step still wins."""
    old = _save(tmp_path / "a.ckpt", 5, 1000)
    new = _save(tmp_path / "b.ckpt", 10, 2000)
    os.utime(old, (4000, 4000))
    assert resume.latest(tmp_path) == str(new)
    later_epoch = _save(tmp_path / "c.ckpt", 10, 1500, epoch=1)  # same step, later epoch
    assert resume.latest(tmp_path) == str(later_epoch)
    same = _save(tmp_path / "d.ckpt", 10, 5000, epoch=1)  # a tie: the modification time decides
    assert resume.latest(tmp_path) == str(same)
    info = resume.read_checkpoint_info(same)
    assert (info.global_step, info.epoch, info.mtime_ns) == (10, 1, 5000 * 10**9)


def test_auto_skips_a_newest_checkpoint_with_zeroed_bytes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Zeroed bytes keep the zip index intact and torch.load loads them as weights; their CRC-32 gives them away."""
    good = _save(tmp_path / "step=5.ckpt", 5, 1000)
    damaged = _zero_the_middle(_save(tmp_path / "src.ckpt", 10, 1), tmp_path / "step=10.ckpt", 2000)
    (tmp_path / "src.ckpt").unlink()
    torch.load(damaged, weights_only=True)  # loads silently, with wrong weights
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)
    assert f"resuming from {good}" in caplog.text
    assert f"{damaged} (damaged: its member 'archive/data/0' does not match the CRC-32" in caplog.text
    assert not resume.is_complete_checkpoint(damaged)
    assert resume.read_checkpoint_info(damaged).global_step == 10  # its pickle is fine: only the data is damaged


def test_auto_skips_a_newest_checkpoint_with_a_damaged_pickle(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = _save(tmp_path / "step=5.ckpt", 5, 1000)
    broken = _break_the_pickle(_save(tmp_path / "src.ckpt", 10, 1), tmp_path / "step=10.ckpt", 2000)
    (tmp_path / "src.ckpt").unlink()
    with zipfile.ZipFile(broken) as archive:
        assert archive.testzip() is None  # a valid zip: only the pickle is damaged
    with pytest.raises(Exception, match=r"Weights only load failed|pickle data was truncated"):
        torch.load(broken, weights_only=True)
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)
    assert f"{broken} (damaged: its pickled object (archive/data.pkl) cannot be read" in caplog.text
    with pytest.raises(resume.CheckpointDamagedError, match="pickled object"):
        resume.read_checkpoint_info(broken)


def test_auto_starts_fresh_when_nothing_verifies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _zero_the_middle(_save(tmp_path / "src.ckpt", 10, 1), tmp_path / "step=10.ckpt", 2000)
    (tmp_path / "src.ckpt").unlink()
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.latest(tmp_path) is None
    assert "no checkpoint verifies, starting fresh" in caplog.text


def test_explicit_damaged_checkpoints_are_a_clear_error(tmp_path: Path) -> None:
    whole = _save(tmp_path / "x.ckpt", 1, 1000)
    zeroed = _zero_the_middle(whole, tmp_path / "zeroed.ckpt", 1)
    with pytest.raises(resume.CheckpointDamagedError, match=r"zeroed.ckpt' is damaged: its member .* CRC-32.*'auto'"):
        resume.resolve_ckpt_path(zeroed)
    broken = _break_the_pickle(whole, tmp_path / "broken.ckpt", 1)
    with pytest.raises(ValueError, match=r"broken.ckpt' is damaged: its pickled object .*'auto'"):
        resume.resolve_ckpt_path(str(broken))
    _break_the_pickle(whole, tmp_path / "last.ckpt", 1)
    with pytest.raises(resume.CheckpointDamagedError, match=r"last.ckpt' is damaged: .*'auto' to pick the newest"):
        resume.resolve_ckpt_path("last", tmp_path)


def test_archives_without_crcs_are_checked_for_structure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """torch.save with compute_crc32=False records no CRC-32s: such checkpoints still resume, with a warning."""
    serialization_config.save.compute_crc32 = False
    try:
        path = _save(tmp_path / "step=3.ckpt", 3, 1000)
        unchecked = _save(tmp_path / "step=4.ckpt", 4, 1)
    finally:
        serialization_config.save.compute_crc32 = True
    with zipfile.ZipFile(path) as archive:
        assert {member.CRC for member in archive.infolist()} == {0}
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        info = resume.verify_checkpoint(path)
    assert (info.global_step, info.crc_checked) == (3, False)
    assert "records no CRC-32s" in caplog.text
    assert resume.latest(tmp_path) == str(unchecked)
    data = bytearray(path.read_bytes())
    at = data.index(b"global_step")  # inside data.pkl
    data[at - 4 : at + 8] = bytes(12)
    (tmp_path / "broken.ckpt").write_bytes(bytes(data))
    with pytest.raises(resume.CheckpointDamagedError, match="pickled object"):
        resume.verify_checkpoint(tmp_path / "broken.ckpt")  # without CRC-32s, the pickle is still checked


def test_the_probe_runs_no_code_from_the_pickle(tmp_path: Path) -> None:
    """The pickle is parsed with a reader that imports nothing: a checkpoint that would run code just verifies."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.mkdir, (str(marker),))

    path = tmp_path / "evil.ckpt"
    torch.save({"global_step": 1, "x": Payload()}, path)
    assert resume.verify_checkpoint(path).global_step == 1
    assert not marker.exists()


def test_policies_on_fsspec_urls(tmp_path: Path) -> None:
    root = f"memory://resume-units-{os.getpid()}"
    fs = fsspec.filesystem("memory")
    try:
        assert resume.resolve_ckpt_path("auto", f"{root}/not-yet") is None
        older = _save(tmp_path / "a.ckpt", 5, 1000)
        newer = _save(tmp_path / "b.ckpt", 10, 2000)
        fs.pipe_file(f"{root}/ckpts/step=5.ckpt", older.read_bytes())
        fs.pipe_file(f"{root}/ckpts/step=10.ckpt", newer.read_bytes())
        fs.pipe_file(f"{root}/ckpts/step=15.ckpt", _zero_the_middle(newer, tmp_path / "c.ckpt", 1).read_bytes())
        fs.pipe_file(f"{root}/ckpts/last.ckpt", older.read_bytes())
        assert resume.resolve_ckpt_path("auto", f"{root}/ckpts") == f"{root}/ckpts/step=10.ckpt"
        assert resume.resolve_ckpt_path("last", f"{root}/ckpts") == f"{root}/ckpts/last.ckpt"
        assert resume.resolve_ckpt_path(f"{root}/ckpts/step=5.ckpt") == f"{root}/ckpts/step=5.ckpt"
        with pytest.raises(resume.CheckpointDamagedError, match="CRC-32"):
            resume.resolve_ckpt_path(f"{root}/ckpts/step=15.ckpt")
        with pytest.raises(FileNotFoundError, match="does not exist"):
            resume.resolve_ckpt_path(f"{root}/ckpts/nope.ckpt")
        with pytest.raises(NotADirectoryError, match="is a file"):
            resume.latest(f"{root}/ckpts/last.ckpt")
    finally:
        fs.rm(f"/resume-units-{os.getpid()}", recursive=True)


def test_unknown_url_protocols_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"'nosuchfs://bucket/ckpts'.*Install the fsspec implementation"):
        resume.resolve_ckpt_path("auto", "nosuchfs://bucket/ckpts")


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
    os.utime(target, (5000, 5000))  # a touched last.ckpt (step 10) does not beat a later step
    _save(tmp_path / "last-v1.ckpt", 12, 3000)
    assert resume.resolve_ckpt_path("last", tmp_path) == str(tmp_path / "last-v1.ckpt")


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


# ----------------------------------------------------------------------------------------------------------------------
# Folder checkpoints: torch's distributed checkpoint (sharded FSDP, model parallel) and DeepSpeed's
# ----------------------------------------------------------------------------------------------------------------------


def _sharded(path: Path, step: int) -> Path:
    """A folder as torch's own writer writes it (no checksum index): ``.metadata``, the shards, ``meta.pt``."""
    dcp.save({"model": {"w": torch.arange(64.0), "b": torch.ones(3)}}, checkpoint_id=path)
    torch.save({"global_step": step, "epoch": 0}, path / "meta.pt")
    return path


class _OneRank:
    """What the sharded save reads of a strategy, for one process."""

    is_global_zero = True
    global_rank = 0
    timeout = timedelta(seconds=30)
    checkpoint_io = HPUCheckpointIO()

    @staticmethod
    def broadcast(obj: Any, src: int = 0) -> Any:
        return obj

    @staticmethod
    def barrier(name: str | None = None) -> None:
        return None

    @staticmethod
    def reduce_boolean_decision(decision: bool, all: bool = True) -> bool:
        return decision


def _checksummed(path: Path, step: int) -> Path:
    """A folder as the Trainer's sharded strategies write it now: with its checksum index."""
    state = {"state_dict": {"w": torch.arange(64.0), "b": torch.ones(3)}, "global_step": step, "epoch": 0}
    save_sharded_checkpoint(_OneRank(), state, path, None, model_key="model")
    return path


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _deepspeed(path: Path, step: int, ranks: int = 2, stage: int = 2) -> Path:
    """A folder as DeepSpeed writes it: ``latest`` naming a folder of per-rank states (ZeRO-3: model states too)."""
    tag = path / "checkpoint"
    tag.mkdir(parents=True)
    (path / "latest").write_text("checkpoint")
    model_files = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ranks)] if stage == 3 else []
    for name in model_files or ["mp_rank_00_model_states.pt"]:
        torch.save({"global_step": step, "epoch": 0, "dp_world_size": ranks}, tag / name)
    for rank in range(ranks):
        torch.save({"state": torch.zeros(4)}, tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    return path


@pytest.mark.parametrize("write", [_sharded, _checksummed, _deepspeed])
def test_a_folder_checkpoint_verifies_and_auto_and_last_resume_from_it(tmp_path: Path, write: Any) -> None:
    _save(tmp_path / "epoch=0-step=2.ckpt", step=2, mtime=1000)
    folder = write(tmp_path / "epoch=0-step=6.ckpt", 6)
    assert resume.verify_checkpoint(folder).global_step == 6
    assert resume.resolve_ckpt_path("auto", tmp_path) == str(folder)
    preempted = write(tmp_path / "last-preempted.ckpt", 7)
    assert resume.resolve_ckpt_path("last", tmp_path) == str(preempted)
    assert resume.resolve_ckpt_path("auto", tmp_path) == str(preempted)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sharded_folder_with_a_lost_or_truncated_shard_is_skipped(tmp_path: Path) -> None:
    good = _save(tmp_path / "epoch=0-step=2.ckpt", step=2, mtime=1000)
    folder = _checksummed(tmp_path / "epoch=0-step=6.ckpt", 6)
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(resume.CheckpointDamagedError, match=r"the file '__0_0.distcp' is \d+ bytes long, not the"):
        resume.verify_checkpoint(folder)
    assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)
    shard.unlink()
    with pytest.raises(resume.CheckpointDamagedError, match=r"the file '__0_0.distcp' is missing"):
        resume.verify_checkpoint(folder)
    (folder / "meta.pt").unlink()
    with pytest.raises(resume.CheckpointDamagedError, match="missing"):
        resume.verify_checkpoint(folder)


def _drop_tensor_data(path: Path) -> None:
    data = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(path, "w") as dst:
        for member in src.infolist():
            if "/data/" not in member.filename:
                dst.writestr(member, src.read(member))


def _truncate_the_shard(folder: Path) -> None:
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])


def _load(path: str) -> dict[str, Any]:
    """What a strategy's load does with a checkpoint: torch's loader of a file or of a distributed checkpoint."""
    if not os.path.isdir(path):
        return torch.load(path, weights_only=True)  # type: ignore[no-any-return]
    dcp.load({"model": {"w": torch.zeros(64), "b": torch.zeros(3)}}, checkpoint_id=path)
    return torch.load(os.path.join(path, "meta.pt"), weights_only=True)  # type: ignore[no-any-return]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("write", "damage"),
    [
        (lambda path: _save(path, 6, 2000), _drop_tensor_data),  # its pickle names tensor data it does not hold
        (lambda path: _sharded(path, 6), _truncate_the_shard),  # a folder without a checksum index (older ones)
        (lambda path: _sharded(path, 6), lambda folder: (folder / "__0_0.distcp").unlink()),
    ],
    ids=["missing-tensor-data", "truncated-shard-no-index", "lost-shard-no-index"],
)
def test_what_verification_lets_pass_the_fallback_catches(tmp_path: Path, write: Any, damage: Any) -> None:
    """Damage with no verification layer of its own: it verifies, torch's loader fails on it, and the fallback moves
    it aside and loads the older checkpoint."""
    older = _save(tmp_path / "epoch=0-step=2.ckpt", 2, 1000)
    newer = tmp_path / "epoch=0-step=6.ckpt"
    write(newer)
    damage(newer)
    chosen = resume.resolve_ckpt_path("auto", tmp_path)
    assert chosen == str(newer)  # verification passes it
    assert resume.load_or_fall_back(_OneRank(), chosen, _load)["global_step"] == 2
    assert Path(f"{newer}{resume.UNLOADABLE_SUFFIX}").exists()
    assert older.is_file()


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's single-process warning for distributed checkpoints
def test_a_sharded_folder_with_a_flipped_byte_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The checksum index written with the shards catches a change that keeps every file's length, which torch's
    reader loads without a word."""
    good = _checksummed(tmp_path / "epoch=0-step=2.ckpt", 2)
    folder = _checksummed(tmp_path / "epoch=0-step=6.ckpt", 6)
    shard = folder / "__0_0.distcp"
    data = shard.read_bytes()
    at = data.index(torch.arange(64.0).numpy().tobytes())  # the weight's bytes, inside the shard
    flipped = shutil.copytree(folder, tmp_path / "flipped")
    (flipped / shard.name).write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    state = {"model": {"w": torch.zeros(64), "b": torch.zeros(3)}}
    dcp.load(state, checkpoint_id=flipped)
    assert not torch.equal(state["model"]["w"], torch.arange(64.0))  # loaded, wrong
    with pytest.raises(resume.CheckpointDamagedError, match=r"the file '__0_0.distcp' does not match the CRC-32"):
        resume.verify_checkpoint(flipped)
    shutil.rmtree(flipped)
    assert resume.verify_checkpoint(folder).crc_checked
    index = json.loads((folder / resume.CHECKSUMS_FILENAME).read_text())
    assert sorted(index["files"]) == [".metadata", "__0_0.distcp"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".checksums-")]  # the ranks' parts are merged
    for name in ("__0_0.distcp", ".metadata"):
        copy = tmp_path / f"copy-{name}.ckpt"
        shutil.copytree(folder, copy)
        _flip_a_byte(copy / name)
        with pytest.raises(resume.CheckpointDamagedError, match=rf"the file '{name}' does not match the CRC-32"):
            resume.verify_checkpoint(copy)
        shutil.rmtree(copy)
    _flip_a_byte(folder / "__0_0.distcp")
    assert resume.read_checkpoint_info(folder).global_step == 6  # the sizes are right: only the bytes tell
    with caplog.at_level("WARNING", logger="lightning_gaudi.resume"):
        assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)
    assert "does not match the CRC-32" in caplog.text
    with pytest.raises(resume.CheckpointDamagedError, match=r"does not match the CRC-32"):
        resume.resolve_ckpt_path(folder)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sharded_folders_checksum_index_is_checked(tmp_path: Path) -> None:
    folder = _checksummed(tmp_path / "epoch=0-step=6.ckpt", 6)
    index = folder / resume.CHECKSUMS_FILENAME
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes() + b"more")
    with pytest.raises(resume.CheckpointDamagedError, match=r"'__0_0.distcp' is \d+ bytes long, not the \d+ written"):
        resume.read_checkpoint_info(folder)
    index.write_text("{not json")
    with pytest.raises(resume.CheckpointDamagedError, match=r"checksum index \(.checksums\) cannot be read"):
        resume.read_checkpoint_info(folder)
    index.unlink()  # as an older checkpoint: checked by its shards' lengths
    assert not resume.verify_checkpoint(folder).crc_checked


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_shard_of_another_save_is_caught(tmp_path: Path) -> None:
    for step in (2, 6):
        state = {"state_dict": {"w": torch.full((64,), float(step))}, "global_step": step, "epoch": 0}
        save_sharded_checkpoint(_OneRank(), state, tmp_path / f"step={step}.ckpt", None, model_key="model")
    shutil.copy(tmp_path / "step=2.ckpt" / "__0_0.distcp", tmp_path / "step=6.ckpt" / "__0_0.distcp")  # same length
    with pytest.raises(resume.CheckpointDamagedError, match=r"'__0_0.distcp' does not match the CRC-32"):
        resume.verify_checkpoint(tmp_path / "step=6.ckpt")


def test_each_rank_indexes_the_shards_torchs_writer_names_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save_staged(..., checksums=True)`` with two ranks (threads): each indexes its ``__<rank>_<n>.distcp``, rank 0
    also ``.metadata``; ``meta.pt`` (its own CRC-32s) is left out; one index lists them all, the ranks' parts merged."""
    sync, shared = threading.Barrier(2, timeout=30), [None]

    class Rank(_OneRank):
        def __init__(self, rank: int) -> None:
            self.global_rank, self.is_global_zero = rank, rank == 0

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            if self.is_global_zero:
                shared[0] = obj
            sync.wait()
            value = shared[0]
            sync.wait()
            return value

        def barrier(self, name: str | None = None) -> None:
            sync.wait()

    data = {"__0_0.distcp": b"zero" * 100, "__1_0.distcp": b"one" * 100, "__1_1.distcp": b"1", ".metadata": b"m"}

    ranks, crc_by = {}, {}  # the rank of each thread, the rank that computed each file's CRC-32

    def crc32(path: str) -> int:
        crc_by[Path(path).name] = ranks[threading.get_ident()]
        return resume._crc32(path)

    monkeypatch.setattr(_staged, "_crc32", crc32)

    def write(rank: int, staging: Path) -> None:
        ranks[threading.get_ident()] = rank
        for name, content in data.items():
            if name.startswith(f"__{rank}_") or (rank == 0 and not name.startswith("__")):
                (staging / name).write_bytes(content)
        if rank == 0:
            (staging / "meta.pt").write_bytes(b"p")

    with ThreadPoolExecutor(2) as pool:
        saves = [
            pool.submit(save_staged, Rank(r), tmp_path / "s.ckpt", lambda staging, r=r: write(r, staging), True)
            for r in (0, 1)
        ]
        for save in saves:
            save.result()
    assert sorted(p.name for p in (tmp_path / "s.ckpt").iterdir()) == sorted([*data, "meta.pt", ".checksums"])
    assert crc_by == {"__0_0.distcp": 0, ".metadata": 0, "__1_0.distcp": 1, "__1_1.distcp": 1}
    index = json.loads((tmp_path / "s.ckpt" / resume.CHECKSUMS_FILENAME).read_text())
    assert index == {
        "algorithm": "crc32",
        "files": {
            name: {"crc32": f"{zlib.crc32(content):08x}", "size": len(content)} for name, content in data.items()
        },
    }


def test_a_deepspeed_folder_missing_a_ranks_state_is_skipped(tmp_path: Path) -> None:
    folder = _deepspeed(tmp_path / "epoch=0-step=6.ckpt", 6)
    (folder / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(resume.CheckpointDamagedError, match=r"1 of its 2 ranks' optimizer states"):
        resume.verify_checkpoint(folder)
    assert resume.resolve_ckpt_path("auto", tmp_path) is None
    (tmp_path / "plain.ckpt").mkdir()
    with pytest.raises(resume.CheckpointDamagedError, match="without the metadata of a sharded or DeepSpeed"):
        resume.verify_checkpoint(tmp_path / "plain.ckpt")


def test_a_zero3_folder_missing_a_ranks_model_states_is_skipped(tmp_path: Path) -> None:
    good = _deepspeed(tmp_path / "epoch=0-step=4.ckpt", 4, stage=3)
    folder = _deepspeed(tmp_path / "epoch=0-step=6.ckpt", 6, stage=3)
    assert resume.verify_checkpoint(folder).global_step == 6
    (folder / "checkpoint" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(resume.CheckpointDamagedError, match=r"1 of its 2 ranks' model states are there"):
        resume.verify_checkpoint(folder)
    assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)
    (good / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink()  # rank 0's: the step is in rank 1's
    with pytest.raises(resume.CheckpointDamagedError, match=r"1 of its 2 ranks' model states are there"):
        resume.verify_checkpoint(good)


@pytest.mark.parametrize("name", ["mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
def test_a_deepspeed_folder_with_a_flipped_byte_is_skipped(tmp_path: Path, name: str) -> None:
    """DeepSpeed's states are torch.save archives: the CRC-32s torch records while writing them catch the change."""
    good = _deepspeed(tmp_path / "epoch=0-step=4.ckpt", 4)
    folder = _deepspeed(tmp_path / "epoch=0-step=6.ckpt", 6)
    states = folder / "checkpoint" / name
    with zipfile.ZipFile(states) as archive:  # a byte in the middle of the pickle's stored bytes
        member = next(m for m in archive.infolist() if m.filename.endswith("/data.pkl"))
    data = bytearray(states.read_bytes())
    header = member.header_offset  # a local header is 30 bytes, then the name and the extra field
    name_length = int.from_bytes(data[header + 26 : header + 28], "little")
    extra_length = int.from_bytes(data[header + 28 : header + 30], "little")
    data[header + 30 + name_length + extra_length + member.compress_size // 2] ^= 0x01
    states.write_bytes(bytes(data))
    with pytest.raises(resume.CheckpointDamagedError, match="does not match the CRC-32"):
        resume.verify_checkpoint(folder)
    assert resume.resolve_ckpt_path("auto", tmp_path) == str(good)


def test_staging_folders_are_not_checkpoints(tmp_path: Path) -> None:
    _sharded(tmp_path / ".epoch=0-step=6.ckpt.0123abcd-42-0123abcd.tmp", 6)  # a sharded save's staging folder
    _deepspeed(tmp_path / "epoch=0-step=6.ckpt.partial", 6)  # not named .ckpt
    assert resume.resolve_ckpt_path("auto", tmp_path) is None


def test_auto_weighs_slurm_requeue_checkpoints(tmp_path: Path) -> None:
    """Lightning's SIGUSR1 handler writes ``hpc_ckpt_<N>.ckpt`` into ``default_root_dir``; "auto" sees them."""
    ckpts, root = tmp_path / "checkpoints", tmp_path
    ckpts.mkdir()
    folder = _save(ckpts / "step=4.ckpt", 4, 1000)
    requeued = _save(root / "hpc_ckpt_1.ckpt", 6, 2000)
    _save(root / "other.ckpt", 99, 3000)  # not a requeue checkpoint: not a candidate
    assert resume.resolve_ckpt_path("auto", ckpts) == str(folder)
    assert resume.resolve_ckpt_path("auto", ckpts, requeue_dir=root) == str(requeued)
    newer = _save(ckpts / "step=8.ckpt", 8, 4000)
    assert resume.resolve_ckpt_path("auto", ckpts, requeue_dir=root) == str(newer)
    assert resume.resolve_in_checkpoint_dir("auto", None, requeue_dir=root) == str(requeued)


def test_a_damaged_requeue_checkpoint_is_refused_on_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing else to resume, "auto" gives None, and Lightning on SLURM would then load the damaged file."""
    _truncate(_save(tmp_path / "src.ckpt", 6, 1), tmp_path / "hpc_ckpt_1.ckpt", 2000)
    (tmp_path / "src.ckpt").unlink()
    assert resume.resolve_ckpt_path("auto", tmp_path / "ckpts", requeue_dir=tmp_path) is None  # not on SLURM
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(resume.CheckpointDamagedError, match=r"hpc_ckpt_1.ckpt.*Remove them to start fresh"):
        resume.resolve_ckpt_path("auto", tmp_path / "ckpts", requeue_dir=tmp_path)
