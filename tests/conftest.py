"""Shared fixtures: the HPU the tests run on (eager or lazy emulation, or the bridge double) and helper paths.

Every fixture sets its environment through ``monkeypatch`` and empties the seam's backend cache
(``lightning_gaudi.hpu._backends``) before and after, so no test sees another test's backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV

TESTS_DIR = Path(__file__).parent
BRIDGE_DOUBLE_DIR = TESTS_DIR / "bridge_double"
HELPERS_DIR = TESTS_DIR / "helpers"

_ENV = (hpu.EMULATE_ENV, hpu.DEVICES_ENV, hpu.DEVICE_NAME_ENV)
#: What a launcher sets: left behind by an in-process launch, they would make Lightning think processes exist already.
_LAUNCH_ENV = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
#: ``1`` (or ``pytest --real-bridge``, which sets it): the ``bridge_double`` fixture yields Intel's real bridge, so the
#: bridge-path tests (marked ``bridge``) run on a Gaudi; ``python -m lightning_gaudi.doctor`` sets it there.
REAL_BRIDGE_ENV = "LIGHTNING_GAUDI_TEST_REAL_BRIDGE"

# torch.compile in eager emulation defaults to inductor, which generates and builds C++ for every graph (seconds
# each). The tests check what dynamo captures, guards and recompiles, the same whatever the backend: aot_eager
# traces the same graphs without building code. Subprocesses started with this environment inherit it; a value
# exported before pytest starts wins.
os.environ.setdefault(COMPILE_BACKEND_ENV, "aot_eager")
# A CUDA build of torch (PyPI's, the compat runs') warms inductor's pool of compile workers, Python processes, when
# inductor is imported (torch 2.7 `_inductor/async_compile.py:456-467`, with the triton package installed): off, so a
# quick test starts none; a test that compiles with inductor starts its workers and is marked subprocess.
os.environ.setdefault("TORCH_WARM_POOL", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--real-bridge", action="store_true", help=f"bridge tests on Intel's bridge ({REAL_BRIDGE_ENV})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bridge: uses the bridge_double fixture (the real bridge with --real-bridge)")
    config.addinivalue_line("markers", "double_only(reason): a bridge test that skips on the real bridge, saying why")
    if config.getoption("--real-bridge"):
        os.environ[REAL_BRIDGE_ENV] = "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "bridge_double" in getattr(item, "fixturenames", ()):
            item.add_marker("bridge")
        only = item.get_closest_marker("double_only")
        if only is not None and real_bridge():
            item.add_marker(pytest.mark.skip(reason=f"on the real bridge: {only.args[0]}"))


def real_bridge() -> bool:
    """Whether the bridge tests run on Intel's real ``habana_frameworks`` instead of the double."""
    return os.environ.get(REAL_BRIDGE_ENV, "") not in ("", "0")


class _RealBridgeState:
    """The double's state module on the real bridge: a test that configures the double or reads its call log
    skips (the real bridge records no calls)."""

    def __getattr__(self, name: str) -> Any:
        pytest.skip(f"uses the bridge double's `{name}` (its call log or settings), which the real bridge lacks")


#: Python processes started while a test not marked ``subprocess`` runs (:func:`audit_python_starts`), and whether one
#: is running.
PYTHON_STARTS: list[str] = []
_QUICK_TEST_RUNNING = [False]


def audit_python_starts(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook (``sys.addaudithook``): records a Python process started while a quick test runs."""
    if event != "subprocess.Popen" or not _QUICK_TEST_RUNNING[0]:
        return
    executable, command = args[0], args[1]
    program = executable or (command if isinstance(command, str | bytes) else command[0])
    if Path(os.fsdecode(program)).name.startswith("python"):
        PYTHON_STARTS.append(str(command)[:200])


# hidden from dynamo: the hook runs inside compiled frames (audit events fire while dynamo compiles), and torch 2.10
# counted it as a frame to compile, once per process, which made a frame-counting test depend on what ran before it
sys.addaudithook(torch.compiler.disable(audit_python_starts))


@pytest.fixture(autouse=True)
def _quick_tests_start_no_python(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that starts a Python process (a rank, a launcher, a probe) is marked ``subprocess``, so that the quick
    subset (``-m "not subprocess"``) starts none."""
    quick = request.node.get_closest_marker("subprocess") is None
    PYTHON_STARTS.clear()
    _QUICK_TEST_RUNNING[0] = quick
    yield
    _QUICK_TEST_RUNNING[0] = False
    if quick and PYTHON_STARTS:
        started, PYTHON_STARTS[:] = list(PYTHON_STARTS), []
        pytest.fail(
            f"this test started {len(started)} Python process(es), the first {started[0]}, and is not marked"
            " subprocess: mark it @pytest.mark.subprocess (the quick subset starts no process)"
        )


@pytest.fixture(autouse=True)
def _restore_rank_zero() -> Iterator[None]:
    """Puts back the process-wide rank that Lightning's rank-zero helpers read.

    Building a distributed Trainer sets it from the launch (``RANK=3`` under a simulated torchrun makes this process
    "rank 3"), which would silence every later test's loggers and rank-zero warnings.
    """
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

    saved = (getattr(rank_zero_only, "rank", 0), getattr(utils_rank_zero_only, "rank", 0))
    yield
    rank_zero_only.rank, utils_rank_zero_only.rank = saved  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Puts back the launch variables (and the card a bridge import picks) after each test, its fixtures included.

    A launch variable left in this process reaches every later subprocess test: importing Intel's bridge (or its
    double) exports ``MASTER_PORT=12345`` where it was unset, and two jobs started at once with it then met on that
    port (seen: the two LitGPT jobs, ``EADDRINUSE``, after a test of ``initialize_distributed_hpu``).
    """
    names = (*_LAUNCH_ENV, "HLS_MODULE_ID", "ID")
    saved = {name: os.environ.get(name) for name in names}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _restore_functional_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """Puts back ``torch.nn.functional.linear`` after each test.

    Building a ZeRO-3 engine in this process swaps it for DeepSpeed's ``zero3_linear_wrap`` for the life of the
    process (DeepSpeed's ``memory_efficient_linear``, on by default). Left in place, every later ``nn.Linear`` runs a
    frame that is not torch's, so dynamo starts compiling where it would skip torch's own modules.
    """
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)


def _forget_bridge() -> None:
    for name in list(sys.modules):
        if name == "habana_frameworks" or name.startswith("habana_frameworks.") or name == "_bridge_double_state":
            del sys.modules[name]
    # the double's core registers itself as torch.hpu, as the bridge does, which torch refuses to do twice
    if "bridge_double" in str(getattr(getattr(torch, "hpu", None), "__file__", "")):
        del torch.hpu
        sys.modules.pop("torch.hpu", None)


@pytest.fixture
def clean_hpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No HPU setting nor launcher variable in the environment and an empty backend cache (restored afterwards).

    Yields the ``monkeypatch`` object, so a test can set ``LIGHTNING_GAUDI_*`` variables of its own.
    """
    for name in (*_ENV, *_LAUNCH_ENV):
        monkeypatch.delenv(name, raising=False)
    hpu._backends.clear()
    yield monkeypatch
    hpu._backends.clear()


@pytest.fixture
def isolated_env(clean_hpu_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``clean_hpu_env`` that also restores the whole environment afterwards (the Hydra app and some callbacks
    export variables by design)."""
    saved = dict(os.environ)
    yield clean_hpu_env
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def eager_hpu(clean_hpu_env: pytest.MonkeyPatch) -> hpu.Backend:
    """Eager emulation (``LIGHTNING_GAUDI_EMULATE=eager``): 8 emulated GAUDI2 cards (set explicitly: the default
    follows the machine's cores). Returns the backend."""
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICES_ENV, "8")
    return hpu.get_backend()


@pytest.fixture
def lazy_hpu(clean_hpu_env: pytest.MonkeyPatch) -> hpu.Backend:
    """Lazy emulation (``LIGHTNING_GAUDI_EMULATE=lazy``, torch's Lazy Tensor Core). Returns the backend."""
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "lazy")
    return hpu.get_backend()


@pytest.fixture
def no_hpu(clean_hpu_env: pytest.MonkeyPatch) -> None:
    """Neither emulation nor Intel's bridge: what a CPU-only machine without settings looks like."""
    if real_bridge():
        pytest.skip("Intel's bridge is in use (--real-bridge)")
    _forget_bridge()
    if hpu.bridge_installed():
        pytest.skip("Intel's bridge is installed on this machine")


@pytest.fixture
def bridge_double(clean_hpu_env: pytest.MonkeyPatch) -> Iterator[ModuleType | Any]:
    """The real-bridge code path, on a test double of Intel's ``habana_frameworks`` package.

    Puts ``tests/bridge_double`` first on ``sys.path`` (so ``import habana_frameworks.torch...`` finds the double),
    unsets ``LIGHTNING_GAUDI_EMULATE`` (so :func:`lightning_gaudi.hpu.get_backend` picks ``HabanaBackend``) and
    empties the backend cache. Afterwards it removes the double from ``sys.path`` and ``sys.modules`` and empties
    the cache again.

    The double has the bridge's module paths, names and signatures (``../shared/habana-api.md``). Yields its
    state module, ``_bridge_double_state``:

    - ``calls``: every call into the double, in order, as ``Call(name, args, kwargs)``; names are qualified like
      ``"core.mark_step"``, ``"hpu.memory_stats"``, ``"hccl.initialize_distributed_hpu"``, ``"hpex.FusedAdamW"``,
      ``"metrics.metric_global"``; importing ``habana_frameworks.torch.distributed.hccl`` logs ``"import hccl"``.
    - ``called(name)`` -> the calls with that name; ``names()`` -> all names; ``record(name, *args, **kwargs)``
      adds an entry (e.g. to order a monkeypatched call among the bridge's); ``reset()`` empties the log and keeps
      the settings; ``restore_defaults()`` empties it and restores the default device.
    - ``configure(device_count=8, device_name="GAUDI2", lazy=None, memory={...}, metrics={...})`` sets what the
      double reports; ``lazy=None`` follows ``PT_HPU_LAZY_MODE`` (default lazy) as bridge 1.19 does.

    Importing the double (any of its modules) does what importing the bridge does: it registers ``torch.hpu`` and an
    ``"hccl"`` process-group backend that is gloo underneath (so ``torch.distributed.init_process_group("hccl")``
    works on the CPU), and sets ``MASTER_ADDR=localhost``/``MASTER_PORT=12345``, ``HLS_MODULE_ID``, ``ID`` as the
    bridge's ``initialize_distributed_hpu()`` does on import; the fixture puts the environment and ``torch.hpu`` back.
    Tensors cannot be moved to the ``"hpu"`` device here: test the bridge path through the seam, the accelerator and
    the strategies; a full ``fit`` on the double keeps the backend's tensors on the CPU (``bridge_double_fit.py``).

    With ``--real-bridge`` (:data:`REAL_BRIDGE_ENV`) it yields a stand-in for the state module instead and leaves
    ``sys.path`` alone, so ``habana_frameworks`` is Intel's; a test that touches the stand-in skips, saying why.
    """
    if real_bridge():
        yield _RealBridgeState()
        return
    clean_hpu_env.syspath_prepend(str(BRIDGE_DOUBLE_DIR))
    _forget_bridge()
    import _bridge_double_state as state

    state.restore_defaults()
    # like the bridge, the double exports variables when it is imported (MASTER_ADDR, MASTER_PORT, HLS_MODULE_ID, ID,
    # TORCHINDUCTOR_COMPILE_THREADS, HABANA_PROFILE) and from initialize_distributed_hpu: put the environment back
    saved = dict(os.environ)
    yield state
    os.environ.clear()
    os.environ.update(saved)
    _forget_bridge()
