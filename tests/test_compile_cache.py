"""The compile cache policy: torch's caches in one folder per key (torch, Gaudi software, device, layout, precision),
so a changed torch or layout never reads another's entries; portable artifacts that warm an empty folder."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from lightning_gaudi import compile_cache, hpu
from lightning_gaudi.hpu import runtime


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(compile_cache.TORCH_CACHE_ENV, str(tmp_path / "torch_default"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home_cache"))  # this user's key that signs the artifacts
    torch._dynamo.reset()
    yield tmp_path / "cache"
    torch._dynamo.reset()


def _compile_once(op: Callable[[torch.Tensor], torch.Tensor] = torch.sin) -> dict[str, int]:
    """Compiles one small function of ``op`` with inductor in a fresh dynamo; the FX graph cache's hits and misses
    (a new ``op`` in each test: a kernel built earlier in this process is not built again)."""
    torch._dynamo.reset()
    counters.clear()
    torch.compile(lambda x: (op(x) * 2).sum(dim=0), backend="inductor")(torch.ones(8, 4))
    return {"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"]}


def test_key_is_stable_and_separates_each_part(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ("GAUDI2", 2, "HPUParallelStrategy", "bf16-mixed")
    key, parts = compile_cache.cache_key(*base)
    assert compile_cache.cache_key(*base)[0] == key
    assert parts["torch"] == torch.__version__
    changed = {
        compile_cache.cache_key("GAUDI3", 2, "HPUParallelStrategy", "bf16-mixed")[0],
        compile_cache.cache_key("GAUDI2", 4, "HPUParallelStrategy", "bf16-mixed")[0],
        compile_cache.cache_key("GAUDI2", 2, "HPUFSDPStrategy", "bf16-mixed")[0],
        compile_cache.cache_key("GAUDI2", 2, "HPUParallelStrategy", "32-true")[0],
    }
    monkeypatch.setattr(runtime, "bridge_release", lambda: (1, 22))
    changed.add(compile_cache.cache_key(*base)[0])
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    changed.add(compile_cache.cache_key(*base)[0])
    assert key not in changed
    assert len(changed) == 6


def test_use_points_torch_at_the_keyed_folder_and_off_changes_nothing(
    policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, parts = compile_cache.cache_key("GAUDI2", 1, "SingleHPUStrategy", "32-true")
    folder = compile_cache.use(key, parts)
    assert folder == policy / key
    assert os.environ[compile_cache.TORCH_CACHE_ENV] == str(folder)
    assert json.loads((folder / "key.json").read_text()) == parts
    monkeypatch.setenv(compile_cache.TORCH_CACHE_ENV, "/elsewhere")
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, "off")
    assert compile_cache.use(key, parts) is None
    assert os.environ[compile_cache.TORCH_CACHE_ENV] == "/elsewhere"


def test_default_folder_is_node_local_and_runtime_moves_or_turns_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(runtime.COMPILE_CACHE_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert runtime.compile_cache_root() == tmp_path / f"lightning_gaudi_compile_cache_{os.getuid()}"
    assert runtime.configure(compile_cache=str(tmp_path / "moved")).compile_cache == str(tmp_path / "moved")
    assert runtime.compile_cache_root() == tmp_path / "moved"
    assert runtime.configure(compile_cache=False).compile_cache is False
    assert runtime.compile_cache_root() is None
    assert runtime.default_recipe_cache() is None
    assert runtime.configure(compile_cache=True).compile_cache is None
    assert runtime.COMPILE_CACHE_ENV not in os.environ
    with pytest.raises(ValueError, match="compile_cache=False to turn"):
        runtime.Runtime(compile_cache="off")


def test_recipe_cache_default_only_where_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(runtime.RECIPE_CACHE_ENV, raising=False)
    cache = runtime.default_recipe_cache()
    assert cache is not None
    assert not cache.delete_on_start
    assert cache.path.startswith(f"{tmp_path}/recipes-torch{importlib.metadata.version('torch')}-gaudi")
    monkeypatch.setenv(runtime.RECIPE_CACHE_ENV, "/mine,false,1024")
    assert runtime.default_recipe_cache() is None


@pytest.mark.subprocess  # inductor builds its C++ kernels in a compiler process
def test_changed_torch_or_layout_does_not_load_stale_entries(policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def under(layout: str) -> Callable[[], dict[str, int]]:
        compile_cache.use(*compile_cache.cache_key("GAUDI2", 1, layout, "32-true"))
        return _compile_once

    assert under("SingleHPUStrategy")() == {"hit": 0, "miss": 1}
    assert under("SingleHPUStrategy")() == {"hit": 1, "miss": 0}  # the same key reads its entry
    assert under("HPUParallelStrategy")() == {"hit": 0, "miss": 1}
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert under("SingleHPUStrategy")() == {"hit": 0, "miss": 1}
    assert len([p for p in policy.iterdir() if (p / "key.json").exists()]) == 3


@pytest.mark.subprocess
def test_portable_artifacts_warm_an_empty_folder_and_only_their_key(
    policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, parts = compile_cache.cache_key("GAUDI2", 1, "SingleHPUStrategy", "32-true")
    compile_cache.use(key, parts)
    _compile_once(torch.cos)
    path = compile_cache.artifacts_path(tmp_path / "checkpoints", key)
    saved = compile_cache.save_artifacts(path)
    assert saved is not None
    assert path.read_bytes() == saved
    assert compile_cache.save_artifacts(path, unless=saved) == saved
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    assert compile_cache.save_artifacts(blocked / "x.bin") is None  # logged, never in the checkpoint's way
    kernels = sorted(str(p.relative_to(policy / key)) for p in (policy / key).glob("*/*.so"))
    assert kernels  # inductor built the CPU kernel, which the artifacts leave out
    with monkeypatch.context() as patched:  # inductor's precompiled headers, in a node's temp folder
        headers = {"h1.h": b"#include <x>\n", "h1.h.gch": os.urandom(4096)}
        for name, data in headers.items():
            (tmp_path / "node_headers" / name).parent.mkdir(exist_ok=True)
            (tmp_path / "node_headers" / name).write_bytes(data)
        patched.setattr(torch._inductor.codecache, "_HEADER_DIR", str(tmp_path / "node_headers"), raising=False)
        saved = compile_cache.save_artifacts(path)
        patched.setattr(torch._inductor.codecache, "_HEADER_DIR", str(tmp_path / "other_node_headers"), raising=False)
        os.environ[runtime.COMPILE_CACHE_ENV] = str(tmp_path / "other_node")  # empty: a requeue elsewhere
        folder = compile_cache.use(key, parts)
        assert folder is not None
        other = compile_cache.artifacts_path(
            tmp_path / "checkpoints", compile_cache.cache_key("GAUDI2", 2, "x", "y")[0]
        )
        assert not compile_cache.load_artifacts(other)
        assert compile_cache.load_artifacts(path) == saved
        assert {p.name: p.read_bytes() for p in (tmp_path / "other_node_headers").iterdir()} == headers
    assert sorted(str(p.relative_to(folder)) for p in folder.glob("*/*.so")) == kernels
    assert _compile_once(torch.cos) == {"hit": 1, "miss": 0}


def test_damaged_artifacts_are_skipped_with_a_warning(
    policy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "compile_cache-x.bin"
    path.write_bytes(b"not torch's")
    path.with_suffix(".sig").write_text(compile_cache._sign(compile_cache._user_key(), b"not torch's", b""))
    assert not compile_cache.load_artifacts(path)
    assert "did not load" in caplog.text
    assert str(path) in caplog.text
    assert "could not read them" in caplog.text  # signed by this user: torch's reader met them


def test_artifacts_another_user_wrote_or_changed_are_not_loaded(
    policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(path: Path) -> bool:
        caplog.clear()
        return compile_cache.load_artifacts(path) is None and "is not this user's" in caplog.text

    path = tmp_path / "compile_cache-x.bin"
    path.write_bytes(b"artifacts")
    path.with_suffix(".kernels.tar").write_bytes(b"kernels")
    path.with_suffix(".sig").write_text(compile_cache._sign(compile_cache._user_key(), b"artifacts", b"kernels"))
    key_file = tmp_path / "home_cache" / "lightning_gaudi" / compile_cache.KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert not refused(path)  # this user's: past the signature, to torch's reader
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another_user"))
    assert refused(path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home_cache"))
    path.with_suffix(".kernels.tar").write_bytes(b"kernels, changed")
    assert refused(path)
    path.with_suffix(".kernels.tar").write_bytes(b"kernels")
    path.with_suffix(".sig").unlink()
    assert refused(path)
    key_file.chmod(0o644)  # a key others can read signs nothing
    assert compile_cache.load_artifacts(path) is None
    assert "chmod 600" in caplog.text


def test_strategy_key_reads_layout_world_and_precision(eager_hpu: hpu.Backend) -> None:
    from lightning.pytorch.plugins.precision import Precision

    from lightning_gaudi.strategies import SingleHPUStrategy

    strategy = SingleHPUStrategy(precision_plugin=Precision())
    _, parts = compile_cache.strategy_key(strategy)
    assert parts["layout"] == "SingleHPUStrategy"
    assert parts["world_size"] == 1
    assert parts["precision"] == "32-true"


@pytest.mark.subprocess
def test_a_requeue_on_another_node_reads_its_graphs_from_beside_the_checkpoint(
    eager_hpu: hpu.Backend, policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.workload import Workload, loader, quiet_trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_gaudi.callbacks import HPUCompile
    from lightning_gaudi.strategies import SingleHPUStrategy

    monkeypatch.setenv(runtime.COMPILE_BACKEND_ENV, "inductor")
    checkpoints = tmp_path / "run" / "checkpoints"

    def fit(steps: int, ckpt_path: Path | None) -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        saver = ModelCheckpoint(dirpath=checkpoints, save_last=True)
        trainer = quiet_trainer(
            max_steps=steps, max_epochs=-1, callbacks=[HPUCompile(), saver], enable_checkpointing=True
        )
        trainer.fit(Workload(), loader(8), ckpt_path=ckpt_path)
        return {"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"]}

    assert fit(2, None) == {"hit": 0, "miss": 2}
    key = compile_cache.strategy_key(SingleHPUStrategy())[0]
    assert sorted(p.name for p in checkpoints.glob("compile_cache-*")) == [
        f"compile_cache-{key}.bin",
        f"compile_cache-{key}.kernels.tar",
        f"compile_cache-{key}.sig",
    ]
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path / "other_node"))  # an empty node-local folder
    assert fit(4, checkpoints / "last.ckpt") == {"hit": 2, "miss": 0}  # forward and backward: none compiled


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("/local/cc", "/local/cc"), ("true", True)])
def test_the_cli_reads_runtime_compile_cache(value: str, expected: object) -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(runtime.Runtime, "runtime", instantiate=False)
    assert parser.parse_args(["--runtime.compile_cache", value]).runtime.compile_cache == expected


def test_the_bridge_loads_with_the_policys_recipe_cache(
    bridge_double: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real-bridge path the policy's recipe cache is in the environment before the bridge loads (it reads the
    variable once, then); a value the user set is left alone."""
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(runtime.RECIPE_CACHE_ENV, raising=False)
    assert type(hpu.get_backend()).__name__ == "HabanaBackend"
    value = os.environ[runtime.RECIPE_CACHE_ENV]
    assert value.startswith(f"{tmp_path}/recipes-torch")
    assert runtime.RecipeCache.parse(value).delete_on_start is False


@contextlib.contextmanager
def _held(lock: Path) -> Iterator[None]:
    """``lock`` held by another thread (as another rank would hold it) until the block ends."""
    import threading

    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with compile_cache._exclusive(lock, timeout=5):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    try:
        yield
    finally:
        release.set()
        thread.join()


_NODE_RANK = """
import json, os, sys, time
from pathlib import Path
from typing import Any
import torch
from torch._dynamo.utils import counters
from lightning_gaudi import compile_cache
compile_cache.use(*compile_cache.cache_key("GAUDI2", 2, "HPUParallelStrategy", "32-true"))
backend = compile_cache.node_backend("inductor") if sys.argv[2] == "node" else "inductor"
go = Path(sys.argv[1]) / "go"
Path(sys.argv[1], f"ready{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.05)
x = torch.ones(8, 4, requires_grad=True)
torch.compile(lambda t: (torch.tanh(t) * 3).sum(), backend=backend)(x).backward()
print(json.dumps({k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}))
"""


def _two_ranks(tmp_path: Path, how: str) -> list[dict[str, int]]:
    """Two processes of one node that compile the same forward and backward at the same moment; their FX graph cache
    hits and misses."""
    import subprocess
    import sys
    import time

    # one compile thread each: no pool of compile workers per process, which would crowd the suite's other tests
    env = {
        **os.environ,
        runtime.COMPILE_CACHE_ENV: str(tmp_path / f"cache_{how}"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    env.pop(compile_cache.TORCH_CACHE_ENV, None)
    ranks = [
        subprocess.Popen([sys.executable, "-c", _NODE_RANK, str(tmp_path), how], env=env, stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    while len(list(tmp_path.glob("ready*"))) < 2:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    out = [rank.communicate(timeout=300)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    for stale in [*tmp_path.glob("ready*"), tmp_path / "go"]:
        stale.unlink()
    return sorted((json.loads(line) for line in out), key=lambda c: -c.get("fxgraph_cache_miss", 0))


@pytest.mark.subprocess
def test_a_nodes_ranks_compile_each_graph_once(tmp_path: Path) -> None:
    # started together, each rank compiles the forward and the backward itself; with NodeCompile one does
    assert _two_ranks(tmp_path, "torch") == [{"fxgraph_cache_miss": 2}] * 2
    assert _two_ranks(tmp_path, "node") == [{"fxgraph_cache_miss": 2}, {"fxgraph_cache_hit": 2}]


def test_node_backend_only_under_the_policy(policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = compile_cache.use(*compile_cache.cache_key("GAUDI2", 1, "SingleHPUStrategy", "32-true"))
    node = compile_cache.node_backend("hpu_backend")
    assert isinstance(node, compile_cache.NodeCompile)
    assert node.backend == "hpu_backend"
    assert node.locks == folder / "locks"  # type: ignore[operator]
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, "off")
    assert compile_cache.node_backend("hpu_backend") == "hpu_backend"


def test_a_rank_waits_for_the_compiling_one_and_gives_up_naming_it(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "graph.lock"
    with (
        _held(lock),
        pytest.raises(TimeoutError, match=rf"waited 0.3 s for another process on this node \(.*pid {os.getpid()}"),
        compile_cache._exclusive(lock, timeout=0.3),
    ):
        pass
    with compile_cache._exclusive(lock, timeout=0.3):  # the holder is done: taken at once
        pass


@pytest.mark.subprocess  # torch 2.7 starts inductor's compile workers at a first compile, whatever the backend
def test_node_compile_compiles_the_backward_with_the_forward(policy: Path) -> None:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    compiled: list[str] = []

    def count(kind: str) -> Callable[..., Any]:
        def compiler(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            compiled.append(kind)
            return make_boxed_func(graph.forward)

        return compiler

    torch._dynamo.reset()
    torch._dynamo.register_backend(aot_autograd(fw_compiler=count("fw"), bw_compiler=count("bw")), "lg_count")
    compile_cache.use(*compile_cache.cache_key("GAUDI2", 1, "SingleHPUStrategy", "32-true"))
    x = torch.ones(3, requires_grad=True)
    # torch 2.7 has no eager backward lowering: there the backward compiles at its first run, as without the policy
    eager = hasattr(torch._functorch.config, "force_non_lazy_backward_lowering")
    for backend in ("lg_count", compile_cache.node_backend("lg_count")):
        torch._dynamo.reset()
        compiled.clear()
        out = torch.compile(lambda t: (t * 2).sum(), backend=backend)(x)
        before_backward = list(compiled)
        out.backward()
        assert compiled == ["fw", "bw"]
        assert before_backward == (["fw", "bw"] if eager and backend != "lg_count" else ["fw"])


@pytest.mark.subprocess  # an older inductor starts its compile workers before it reads the options
def test_node_compile_passes_options_to_inductor(policy: Path) -> None:
    compile_cache.use(*compile_cache.cache_key("GAUDI2", 1, "SingleHPUStrategy", "32-true"))
    x = torch.ones(3)
    with pytest.raises(Exception, match="Unexpected optimization option not_an_option"):
        torch.compile(lambda t: t + 1, backend=compile_cache.node_backend("inductor"), options={"not_an_option": 1})(x)


@pytest.mark.subprocess  # inductor builds its C++ kernels in a compiler process
def test_fabric_saves_the_artifacts_beside_its_checkpoint_and_loads_them_first(
    eager_hpu: hpu.Backend, policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.fabric import Fabric

    monkeypatch.setenv(runtime.COMPILE_BACKEND_ENV, "inductor")
    path = tmp_path / "run" / "state.ckpt"

    def step(load: bool) -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        fabric = Fabric(accelerator="hpu", devices=1)
        torch.manual_seed(0)
        model = fabric.setup(torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())))
        state = {"model": model}
        if load:
            fabric.load(path, state)
        fabric.backward(model(torch.ones(2, 4)).sum())
        fabric.save(path, state)
        return {"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"]}

    assert step(load=False) == {"hit": 0, "miss": 2}
    assert len(list(path.parent.glob("compile_cache-*.bin"))) == 1
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path / "other_node"))  # an empty node-local folder
    assert step(load=True) == {"hit": 2, "miss": 0}  # forward and backward: none compiled
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, str(tmp_path / "third_node"))
    (path.parent / "state.ckpt").rename(path.parent / "moved.ckpt")
    path = path.parent / "moved.ckpt"
    for artifacts in path.parent.glob("compile_cache-*"):
        artifacts.unlink()
    assert step(load=True) == {"hit": 0, "miss": 2}  # the control: without the artifacts it compiles


@pytest.mark.parametrize("once_per_node", [True, False])
def test_hpu_compile_locks_each_graph_unless_told_not_to(
    eager_hpu: hpu.Backend, policy: Path, monkeypatch: pytest.MonkeyPatch, once_per_node: bool
) -> None:
    from helpers.workload import Workload, loader, quiet_trainer

    from lightning_gaudi.callbacks import HPUCompile

    monkeypatch.setenv(runtime.COMPILE_BACKEND_ENV, "aot_eager")
    quiet_trainer(max_steps=1, callbacks=[HPUCompile(once_per_node=once_per_node)]).fit(Workload(), loader(2))
    locks = list(policy.glob("*/locks/*.lock"))
    assert len(locks) == (1 if once_per_node else 0)  # the training graph (forward and backward under one lock)
    assert all(lock.with_suffix(".done").exists() for lock in locks)


def test_a_graph_compiled_on_the_node_takes_no_lock(policy: Path) -> None:
    folder = compile_cache.use(*compile_cache.cache_key("GAUDI2", 2, "HPUParallelStrategy", "32-true"))
    assert folder is not None
    node = compile_cache.NodeCompile("eager", folder, timeout=0.2)

    def compile_again() -> None:
        torch._dynamo.reset()
        torch.compile(lambda t: t * 2, backend=node)(torch.ones(3))

    compile_again()
    (lock,) = folder.glob("locks/*.lock")
    assert lock.with_suffix(".done").exists()
    with _held(lock):
        compile_again()  # another rank compiling something under that lock does not hold this one up
        lock.with_suffix(".done").unlink()
        with pytest.raises(Exception, match=r"waited 0.2 s for another process on this node"):
            compile_again()
