"""HPUCheckpointIO: CPU tensors in the file, atomic writes (local and fsspec URLs), a round trip between the HPU and
the CPU, file modes, full disks and the temporaries of killed saves."""

from __future__ import annotations

import errno
import os
import secrets
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from helpers.models import RegressionModel, trainer_kwargs
from lightning.pytorch import Trainer

from lightning_gaudi import HPUCheckpointIO, checkpoint_io, hpu
from lightning_gaudi.checkpoint_io import CheckpointDiskFullError, atomic_torch_save

HELPERS = Path(__file__).parent / "reliability_helpers"


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors(value)]
    return []


def test_tensors_are_moved_to_the_cpu(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    device = lazy_hpu.device()
    weight = torch.arange(6.0).reshape(2, 3).to(device)
    checkpoint = {"state_dict": {"w": weight}, "optimizer_states": [{"m": [weight * 2]}], "epoch": 3}
    HPUCheckpointIO().save_checkpoint(checkpoint, tmp_path / "sub" / "c.ckpt")
    assert weight.device.type == "lazy"  # the caller's tensors stay where they were
    loaded = torch.load(tmp_path / "sub" / "c.ckpt", weights_only=True)
    assert all(t.device.type == "cpu" for t in _tensors(loaded))
    torch.testing.assert_close(loaded["state_dict"]["w"], torch.arange(6.0).reshape(2, 3))
    torch.testing.assert_close(loaded["optimizer_states"][0]["m"][0], 2 * torch.arange(6.0).reshape(2, 3))
    assert loaded["epoch"] == 3


def test_round_trip_hpu_to_cpu_and_back(lazy_hpu: hpu.Backend, tmp_path: Path) -> None:
    """Saved from the (lazy-emulated) HPU, loaded on the CPU, resumed on the HPU."""
    model = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=-1, max_epochs=1, limit_train_batches=2))
    trainer.fit(model)
    path = tmp_path / "hpu.ckpt"
    trainer.save_checkpoint(path)
    assert not list(tmp_path.glob("*.tmp"))

    raw = torch.load(path, weights_only=False)
    assert all(t.device.type == "cpu" for t in _tensors(raw["state_dict"]))
    assert all(t.device.type == "cpu" for t in _tensors(raw["optimizer_states"]))

    on_cpu = RegressionModel.load_from_checkpoint(path, map_location="cpu")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(on_cpu.state_dict()[name], tensor.cpu())

    resumed = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=-1, max_epochs=2, limit_train_batches=2))
    trainer.fit(resumed, ckpt_path=path)
    assert trainer.global_step == 4
    assert resumed.seen["param_device"] == "lazy"


def test_trainer_checkpoints_go_through_hpu_checkpoint_io(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trainer.save_checkpoint`` on an HPU strategy writes through HPUCheckpointIO's atomic writer: the file is
    complete, holds CPU tensors, and loads on a CPU-only Trainer."""
    written: list[Path] = []
    real = atomic_torch_save

    def spy(obj: object, path: Path) -> None:
        written.append(Path(path))
        real(obj, path)

    monkeypatch.setattr("lightning_gaudi.checkpoint_io.atomic_torch_save", spy)
    model = RegressionModel()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=1))
    trainer.fit(model)
    path = tmp_path / "manual.ckpt"
    trainer.save_checkpoint(path)
    assert written == [path]
    loaded = torch.load(path, weights_only=True)
    assert all(t.device.type == "cpu" for t in _tensors(loaded))
    assert loaded["global_step"] == 1
    resumed = RegressionModel()
    cpu_trainer = Trainer(accelerator="cpu", **trainer_kwargs(max_steps=2))
    cpu_trainer.fit(resumed, ckpt_path=str(path))
    assert cpu_trainer.global_step == 2


def test_failed_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.ckpt"
    atomic_torch_save({"w": torch.ones(2)}, path)
    before = path.read_bytes()

    def broken_save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        f.write(b"half a checkpoint")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"w": torch.zeros(2)}, path)
    assert path.read_bytes() == before  # the old checkpoint is untouched
    with pytest.raises(OSError, match="disk full"):
        HPUCheckpointIO().save_checkpoint({"w": torch.zeros(2)}, tmp_path / "new.ckpt")
    assert not (tmp_path / "new.ckpt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # no temporary file left behind


def test_storage_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        HPUCheckpointIO().save_checkpoint({}, tmp_path / "c.ckpt", storage_options={"x": 1})
    assert not (tmp_path / "c.ckpt").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002, 0o077])
def test_checkpoints_honour_the_umask(tmp_path: Path, umask: int) -> None:
    """Saved with the mode ``torch.save(obj, path)`` gives (0o666 less the umask), readable by a team that shares
    the file system, not mkstemp's 0o600."""
    previous = os.umask(umask)
    try:
        atomic_torch_save({"w": torch.ones(2)}, tmp_path / "atomic.ckpt")
        torch.save({"w": torch.ones(2)}, tmp_path / "plain.ckpt")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "atomic.ckpt").stat().st_mode)
    assert mode == 0o666 & ~umask, oct(mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.ckpt").stat().st_mode)


_TORCH_ON_A_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662"


@pytest.mark.parametrize(
    "failure",
    [RuntimeError(_TORCH_ON_A_FULL_DISK), OSError(errno.ENOSPC, "No space left on device")],
    ids=["torch-short-write", "ENOSPC"],
)
def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    """torch.save reports a full disk as an "unexpected pos" RuntimeError (its writer stopped short), and closing
    the file as OSError(ENOSPC) (see /dev/full); either way the error says the disk is full."""
    path = tmp_path / "model.ckpt"
    atomic_torch_save({"w": torch.ones(2)}, path)
    before = path.read_bytes()

    def full_disk(obj: object, f: IO[bytes], *args: object, **kwargs: object) -> None:
        f.write(b"PK\x03\x04" + bytes(2**20))  # part of a checkpoint
        raise failure

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(
        CheckpointDiskFullError, match=r"'.*model.ckpt'.* is full .*MiB free, 1 MiB written, removed"
    ) as raised:
        HPUCheckpointIO().save_checkpoint({"w": torch.zeros(2)}, path)
    assert raised.value.errno == errno.ENOSPC
    assert "an earlier checkpoint under this name is untouched" in str(raised.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_torch_really_reports_a_full_disk_as_the_errors_handled_above(tmp_path: Path) -> None:
    """/dev/full answers every write with ENOSPC: the same failure a full file system gives."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    with pytest.raises(RuntimeError, match="unexpected pos"):
        torch.save({"w": torch.ones(2**18)}, "/dev/full")
    with pytest.raises(OSError, match="No space left") as raised, open("/dev/full", "wb") as f:
        torch.save({"w": torch.ones(2**18)}, f)
    assert raised.value.errno == errno.ENOSPC


def _exited_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.mark.subprocess
def test_stale_temporaries_are_removed_before_a_save(tmp_path: Path) -> None:
    """Only our temporaries whose writer cannot be writing them any more: never a live process's, nor a fresh one
    written from another machine (a rank on another node saving into a shared folder), nor anyone else's files."""
    here = checkpoint_io._writer_id()
    elsewhere = "0badc0de"
    assert here != elsewhere
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = {
            checkpoint_io.temporary_name("a.ckpt", here, _exited_pid()),  # its process is gone
            checkpoint_io.temporary_name("a.ckpt", here, os.getpid()),  # ours, and no save of ours is running
            checkpoint_io.temporary_name("a.ckpt", elsewhere, 7),  # not written to for longer than the limit
        }
        kept = {
            checkpoint_io.temporary_name("a.ckpt", here, sleeper.pid),  # a live process on this machine
            checkpoint_io.temporary_name("a.ckpt", elsewhere, 8),  # recently written, on another machine
            ".a.ckpt.k3j4l5m6.tmp",  # not ours
            ".notes.tmp",
            "a.ckpt.tmp",
        }
        for name in stale | kept:
            (tmp_path / name).write_bytes(b"partial")
        old = time.time() - checkpoint_io.STALE_TEMPORARY_AGE_S - 60
        (old_elsewhere,) = (name for name in stale if f".{elsewhere}-7-" in name)
        os.utime(tmp_path / old_elsewhere, (old, old))
        atomic_torch_save({"w": torch.ones(2)}, tmp_path / "b.ckpt")
        assert set(os.listdir(tmp_path)) == kept | {"b.ckpt"}
        sleeper.kill()
        sleeper.wait()
        (was_live,) = (name for name in kept if f"-{sleeper.pid}-" in name)
        assert checkpoint_io.remove_stale_temporaries(tmp_path) == [str(tmp_path / was_live)]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert checkpoint_io.remove_stale_temporaries(tmp_path / "missing") == []


def test_a_save_in_flight_keeps_its_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second save into the same folder (Lightning's AsyncCheckpointIO saves in a thread) leaves the first one's
    temporary alone, and both complete."""
    real_save = torch.save
    writing, release = threading.Event(), threading.Event()

    def slow_save(obj: dict[str, object], f: IO[bytes], *args: Any, **kwargs: Any) -> None:
        if "slow" in obj:
            writing.set()
            assert release.wait(10)
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", slow_save)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            atomic_torch_save({"slow": True, "w": torch.ones(2)}, tmp_path / "first.ckpt")
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert writing.wait(10)
        atomic_torch_save({"w": torch.zeros(2)}, tmp_path / "second.ckpt")
        assert len(list(tmp_path.glob(".first.ckpt.*.tmp"))) == 1
    finally:
        release.set()
        thread.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.ckpt", "second.ckpt"]
    assert torch.load(tmp_path / "first.ckpt", weights_only=True)["slow"] is True


@pytest.mark.subprocess
def test_the_temporary_of_a_killed_save_is_removed_by_the_next_save(tmp_path: Path) -> None:
    """A save SIGKILLed half-way leaves a checkpoint-sized temporary; the next save into the folder removes it."""
    path = tmp_path / "last.ckpt"
    proc = subprocess.Popen([sys.executable, str(HELPERS / "big_save.py"), str(path), "atomic", "256"])
    deadline = time.monotonic() + 60
    try:
        while not any(p.stat().st_size > 16 * 2**20 for p in tmp_path.iterdir()):
            assert proc.poll() is None, "the save finished before it could be interrupted"
            assert time.monotonic() < deadline, "the save never started writing"
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    (leftover,) = tmp_path.iterdir()
    assert leftover.name.startswith(".last.ckpt.")
    assert leftover.suffix == ".tmp"
    HPUCheckpointIO().save_checkpoint({"global_step": 3}, tmp_path / "step=3.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=3.ckpt"]


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"/checkpoint-io-{os.getpid()}-{secrets.token_hex(4)}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_url_checkpoints_go_through_fsspec(
    memory_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lazy_hpu: hpu.Backend
) -> None:
    """``memory://`` (like ``s3://``) reaches its file system: nothing lands in a local ``memory:`` folder."""
    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    url = f"{memory_root}/run/c.ckpt"
    io = HPUCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.arange(3.0).to(lazy_hpu.device())}, "global_step": 4}, url)
    assert list(tmp_path.iterdir()) == []
    assert fs.ls(f"{memory_root}/run", detail=False) == [url.removeprefix("memory://")]
    loaded = io.load_checkpoint(url)
    assert loaded["global_step"] == 4
    assert loaded["state_dict"]["w"].device.type == "cpu"
    io.remove_checkpoint(url)
    assert not fs.exists(url)


def test_url_saves_are_atomic_where_the_file_system_moves_atomically(
    memory_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory:// is written to a temporary and moved: a failed save leaves the old checkpoint and no temporary."""
    fs = fsspec.filesystem("memory")
    url = f"{memory_root}/c.ckpt"
    atomic_torch_save({"global_step": 1}, url)
    before = fs.cat_file(url)

    def broken_save(obj: object, f: IO[bytes], *args: object, **kwargs: object) -> None:
        f.write(b"half a checkpoint")
        raise OSError("connection lost")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="connection lost"):
        atomic_torch_save({"global_step": 2}, url)
    assert fs.cat_file(url) == before
    assert fs.ls(memory_root, detail=False) == [url.removeprefix("memory://")]


class _ObjectStore(MemoryFileSystem):
    """An in-memory object store that records how it is written to (S3, GCS and Azure have no rename; an object
    appears whole when its upload completes)."""

    protocol = "lgtest-objects"
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    calls: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        return super()._strip_protocol(str(path).removeprefix(f"{cls.protocol}://"))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self.calls.append(("upload", path))
        path = self._strip_protocol(path)
        self.store[path] = MemoryFile(self, path, value)

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "r" not in mode:
            self.calls.append((f"open {mode}", path))
        return super()._open(path, mode, *args, **kwargs)

    def mv(self, path1: str, path2: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("mv", path2))
        super().mv(path1, path2, *args, **kwargs)


def test_object_stores_get_the_checkpoint_in_one_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"s3", "gs", "gcs", "az", "abfs"} <= checkpoint_io.OBJECT_STORE_PROTOCOLS
    fsspec.register_implementation(_ObjectStore.protocol, _ObjectStore, clobber=True)
    monkeypatch.setattr(
        checkpoint_io, "OBJECT_STORE_PROTOCOLS", checkpoint_io.OBJECT_STORE_PROTOCOLS | {_ObjectStore.protocol}
    )
    _ObjectStore.calls.clear()
    HPUCheckpointIO().save_checkpoint({"global_step": 9}, "lgtest-objects://bucket/run/c.ckpt")
    assert _ObjectStore.calls == [("upload", "/bucket/run/c.ckpt")]  # no temporary key, no copy
    assert list(_ObjectStore.store) == ["/bucket/run/c.ckpt"]
    assert HPUCheckpointIO().load_checkpoint("lgtest-objects://bucket/run/c.ckpt")["global_step"] == 9


def test_unknown_url_protocols_are_a_clear_error_before_anything_is_written() -> None:
    with pytest.raises(ValueError, match=r"'nosuchfs://bucket/c.ckpt'.*Install the fsspec implementation"):
        HPUCheckpointIO().save_checkpoint({}, "nosuchfs://bucket/c.ckpt")
