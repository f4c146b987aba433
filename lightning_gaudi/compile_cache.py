"""The compile cache policy (docs/runtime.md, "Compile caches"): torch's compile caches (FX graph, AOTAutograd,
inductor's others) in one folder per :func:`cache_key` under :func:`~lightning_gaudi.hpu.runtime.compile_cache_root`,
shared by a node's ranks and kept across restarts, so a changed torch, Gaudi software, generation, layout or precision
never reads another's entries; and torch's portable cache artifacts saved beside the checkpoints
(:func:`save_artifacts`) and loaded before anything compiles (:func:`load_artifacts`), so a job restarted on another
node starts warm; and :class:`NodeCompile`, which makes a node's ranks compile each graph once. Intel's recipe cache
gets its folder where the bridge loads (:func:`~lightning_gaudi.hpu.runtime.default_recipe_cache`)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import io
import json
import logging
import os
import shutil
import socket
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.constants import default_pg_timeout

from lightning_gaudi import hpu
from lightning_gaudi.hpu import runtime

log = logging.getLogger(__name__)

#: torch's variable for the folder of its compile caches (``torch._inductor.runtime.cache_dir_utils.cache_dir``).
TORCH_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: The portable artifacts' file name beside the checkpoints: ``compile_cache-<key>.bin``.
ARTIFACTS_PREFIX = "compile_cache-"
#: This user's key that signs the portable artifacts (:func:`_user_key`), in ``$XDG_CACHE_HOME/lightning_gaudi``.
KEY_FILE = "compile_cache.key"
#: The kernels' archive keeps inductor's precompiled headers under this folder name (inductor's own).
_HEADERS = "precompiled_headers"


def cache_key(device_name: str, world_size: int, layout: str, precision: str) -> tuple[str, dict[str, Any]]:
    """A short digest of what makes compiled code reusable, and what it was made of."""
    parts = {
        "torch": torch.__version__,
        "gaudi_software": runtime.bridge_release(),
        "device": device_name,
        "world_size": world_size,
        "layout": layout,
        "precision": precision,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16], parts


def use(key: str, parts: dict[str, Any]) -> Path | None:
    """Points torch's compile caches at ``<root>/<key>`` (``key.json`` there says what it was made of); ``None``, and
    nothing changes, when the policy is off."""
    root = runtime.compile_cache_root()
    if root is None:
        return None
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "key.json"
    if not record.exists():
        _write(record, (json.dumps(parts, indent=1) + "\n").encode())
    os.environ[TORCH_CACHE_ENV] = str(folder)
    return folder


def artifacts_path(dirpath: str | os.PathLike[str], key: str) -> Path:
    """Where the portable artifacts of ``key`` are kept in a checkpoint folder (their kernels: ``.kernels.tar``)."""
    return Path(dirpath) / f"{ARTIFACTS_PREFIX}{key}.bin"


def strategy_artifacts(dirpath: str | os.PathLike[str] | None, strategy: Any) -> Path | None:
    """:func:`artifacts_path` of ``strategy``'s key in ``dirpath``; ``None`` for no folder or a remote one."""
    if not dirpath or "://" in str(dirpath):
        return None
    return artifacts_path(dirpath, strategy_key(strategy)[0])


def _kernels(path: Path) -> Path:
    return path.with_suffix(".kernels.tar")


def _safe(member: tarfile.TarInfo) -> bool:
    """A kernel as :func:`save_artifacts` packs one: a plain file, two levels down, with no way out of the folder."""
    parts = Path(member.name).parts
    return member.isfile() and len(parts) == 2 and ".." not in parts and not member.name.startswith("/")


def save_artifacts(path: Path, unless: bytes | None = None) -> bytes | None:
    """Writes torch's portable cache artifacts of this process (``torch.compiler.save_cache_artifacts``, torch 2.7
    and newer) to ``path``, and the kernels inductor built into the policy's folder (shared libraries, which the
    artifacts leave out and a CPU build finds by path) with the headers it precompiled for them to
    ``<path>.kernels.tar`` (gzip), and their signature under this user's key (:func:`_user_key`) to ``<path>.sig``,
    unless the artifacts equal ``unless``; returns the artifacts, ``None`` when this torch has none to give or the
    policy is off."""
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    saved = save() if save is not None and runtime.compile_cache_root() is not None else None
    if saved is None or _empty(saved[1]):  # torch 2.7 returns an empty record where later ones return None
        return unless
    if saved[0] == unless:
        return unless
    folder = os.environ.get(TORCH_CACHE_ENV, "")  # torch's folder, where inductor built the kernels
    headers = _header_folder()
    try:
        key = _user_key()
        path.parent.mkdir(parents=True, exist_ok=True)
        with io.BytesIO() as packed:
            with tarfile.open(fileobj=packed, mode="w:gz", compresslevel=1) as tar:
                for kernel in sorted(Path(folder).glob("*/*.so")) if folder else []:
                    tar.add(kernel, str(kernel.relative_to(folder)))
                for header in sorted(headers.glob("*.h*")) if headers else []:
                    tar.add(header, f"{_HEADERS}/{header.name}")
            kernels = packed.getvalue()
        _signature(path).unlink(missing_ok=True)  # signed last: a set written in part never verifies
        _write(path, saved[0])
        _write(_kernels(path), kernels)
        _write(_signature(path), _sign(key, saved[0], kernels).encode())
    except OSError as error:  # never in the way of the checkpoint being saved
        log.warning("lightning_gaudi: could not save the compile cache artifacts %s (%s).", path, error)
        return unless
    return saved[0]


def load_artifacts(path: Path) -> bytes | None:
    """Loads the portable artifacts at ``path`` into torch's caches (``torch.compiler.load_cache_artifacts``), the
    kernels beside them into the policy's folder and the precompiled headers into inductor's, when ``<path>.sig``
    says this user's jobs wrote them (they hold code that runs: another user's are not loaded); returns the artifacts,
    ``None`` when there are none, the policy is off, or they do not load (logged: the job then compiles what they
    lack)."""
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    if load is None or runtime.compile_cache_root() is None or not path.is_file():
        return None
    folder = os.environ.get(TORCH_CACHE_ENV, "")
    try:
        artifacts = path.read_bytes()
        kernels = _kernels(path).read_bytes() if _kernels(path).is_file() else b""
        signature = _signature(path).read_text() if _signature(path).is_file() else ""
        if not hmac.compare_digest(signature, _sign(_user_key(), artifacts, kernels)):
            raise ValueError(
                f"their signature ({_signature(path).name}) is not this user's: loading them would run code that"
                " another user's job compiled"
            )
        if load(artifacts) is None:
            raise ValueError("torch could not read them")
        if folder and kernels:
            headers = _header_folder()
            with tarfile.open(fileobj=io.BytesIO(kernels)) as tar:
                for member in tar.getmembers():
                    if Path(member.name).parts[0] != _HEADERS:
                        target = Path(folder, member.name)
                    elif headers is not None:
                        target = headers / Path(member.name).name
                    else:
                        continue
                    if _safe(member) and not target.exists() and (data := tar.extractfile(member)) is not None:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with data:
                            _write(target, data)  # whole or not at all: a node's ranks load at once
    except Exception as error:  # and whatever its deserializer or tarfile meets in a damaged or foreign file
        log.warning("lightning_gaudi: the compile cache artifacts %s did not load (%s); compiling cold.", path, error)
        return None
    return artifacts


def _signature(path: Path) -> Path:
    return path.with_suffix(".sig")


def _sign(key: bytes, artifacts: bytes, kernels: bytes) -> str:
    mac = hmac.new(key, hashlib.sha256(artifacts).digest(), "sha256")
    mac.update(hashlib.sha256(kernels).digest())
    return mac.hexdigest()


def _user_key() -> bytes:
    """This user's key that signs the portable artifacts (loading them runs the code torch compiled, so a job loads
    only what this user's jobs wrote): 32 random bytes in ``$XDG_CACHE_HOME/lightning_gaudi/compile_cache.key``
    (``~/.cache``), made on first use, readable by the user alone. ``OSError`` when it cannot be made or is not
    private."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_gaudi"
    path = folder / KEY_FILE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{KEY_FILE}.{os.getpid()}"
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(os.urandom(32))
        with contextlib.suppress(FileExistsError):  # a node's ranks start together: the first one's key stands
            os.link(partial, path)
        partial.unlink()
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OSError(f"{path} must belong to this user and be readable by them alone (chmod 600)")
    return path.read_bytes()


def _empty(info: Any) -> bool:
    fields = dataclasses.fields(info) if dataclasses.is_dataclass(info) else ()
    return bool(fields) and not any(getattr(info, field.name) for field in fields)


def _header_folder() -> Path | None:
    """Where inductor keeps the C++ headers it precompiles for CPU kernels: the node's temp folder, outside torch's
    cache folder, so a requeue on another node builds them again (about 10 s) before its first kernel loads."""
    from torch._inductor import codecache

    folder = getattr(codecache, "_HEADER_DIR", None)
    return Path(folder) if isinstance(folder, str) else None


def _write(path: Path, data: bytes | IO[bytes]) -> None:
    """``data`` (bytes, or a file read in chunks) to ``path`` through a temporary beside it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as sink:
        if isinstance(data, bytes):
            sink.write(data)
        else:
            shutil.copyfileobj(data, sink)
    os.replace(partial, path)


def strategy_key(strategy: Any) -> tuple[str, dict[str, Any]]:
    """:func:`cache_key` of a Lightning or Fabric strategy: its class, world size and precision on this device."""
    plugin = getattr(strategy, "precision_plugin", None) or getattr(strategy, "precision", None)
    precision = str(getattr(plugin, "precision", type(plugin).__name__))
    world_size = int(getattr(strategy, "world_size", 1))
    return cache_key(hpu.get_backend().device_name(), world_size, type(strategy).__name__, precision)


class NodeCompile:
    """A ``torch.compile`` backend that compiles each graph once per node: the ranks that share the policy's folder take
    a lock per graph in it, so one compiles while the others wait and then, in parallel, read its work from torch's
    caches; a graph already compiled on the node takes no lock. The backward graph is compiled with the forward
    (``force_non_lazy_backward_lowering``), inside the lock, and the lock is never held across a collective. ``mode``
    and ``options`` reach the wrapped backend as ``torch.compile`` passes them.

    Args:
        backend: the ``torch.compile`` backend doing the work (``"hpu_backend"``, ``"inductor"``, ...).
        folder: the policy's folder of this job (:func:`use`).
        timeout: seconds a rank waits for another's compile before it raises; the default is torch's collective one.
    """

    def __init__(self, backend: str, folder: Path, timeout: float = default_pg_timeout.total_seconds()) -> None:
        self.backend, self.locks, self.timeout = backend, folder / "locks", timeout

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        mode, options = kwargs.pop("mode", None), kwargs.pop("options", None)
        if self.backend == "inductor":
            inner: Any = torch._TorchCompileInductorWrapper(mode, options, None)
        else:
            inner = torch._TorchCompileWrapper(self.backend, mode, options, None)
        shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in example_inputs]
        digest = hashlib.sha256(f"{self.backend} {mode} {options} {shapes}\n{graph.code}".encode()).hexdigest()[:20]
        done = self.locks / f"{digest}.done"  # compiled once on this node: the others read it in parallel
        if not done.exists():
            with _exclusive(self.locks / f"{digest}.lock", self.timeout):
                if not done.exists():
                    with _eager_backward():
                        compiled = inner(graph, example_inputs)
                    done.touch()
                    return compiled
        with _eager_backward():
            return inner(graph, example_inputs)


def node_backend(backend: str) -> str | NodeCompile:
    """``backend`` compiled once per node (:class:`NodeCompile`) when the policy has given this process its folder
    (:func:`use`), else ``backend`` itself."""
    folder = os.environ.get(TORCH_CACHE_ENV)
    if runtime.compile_cache_root() is None or not folder:
        return backend
    return NodeCompile(backend, Path(folder))


def _eager_backward() -> contextlib.AbstractContextManager[Any]:
    config = torch._functorch.config
    if not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()  # an older torch compiles the backward at its first run, outside the lock
    return config.patch(force_non_lazy_backward_lowering=True)


@contextlib.contextmanager
def _exclusive(path: Path, timeout: float) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (released by the OS when the holder dies); raises ``TimeoutError`` naming
    the holder after ``timeout`` seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.seek(0)
                    raise TimeoutError(
                        f"lightning_gaudi: waited {timeout:g} s for another process on this node ({handle.read()!r})"
                        f" to compile a graph (lock {path}). If it hangs, end it; to compile in every process instead,"
                        " turn the compile cache policy off (LIGHTNING_GAUDI_COMPILE_CACHE=off)."
                    ) from None
                time.sleep(0.1)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{socket.gethostname()} pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
