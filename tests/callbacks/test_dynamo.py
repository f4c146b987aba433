"""The readers of torch.compile's private records (``lightning_gaudi/callbacks/dynamo.py``).

The canaries fail when torch moves or reshapes what the readers rely on: dynamo's frame counter, its compilation
records (recompile reason, recompile-limit failure), the graph-break log with the user's source line, the cache
entries of a code object, DDPOptimizer's first bucket and inductor's C++ compiler lookup.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lightning_gaudi.callbacks import dynamo
from lightning_gaudi.distributed import shutdown
from lightning_gaudi.emulator import eager


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch.compiler.reset()
    yield
    torch.compiler.reset()


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x) * 2


class Breaks(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        y = x * 2
        print("a graph break")  # dynamo cannot trace print: the graph splits here
        return y + 1


def test_available_on_the_installed_torch() -> None:
    assert dynamo.missing_targets() == []
    assert dynamo.available(), dynamo.unavailable_reason()


@torch._dynamo.config.patch(recompile_limit=2)
def test_compilations_with_recompile_reasons_and_the_limit() -> None:
    module = Scale()
    log = dynamo.CompilationLog()
    frames = dynamo.frames_started()
    compiled = torch.compile(module.forward, backend="eager", dynamic=False)
    for length in (3, 4, 5, 6):
        compiled(torch.ones(length, 4))
    found = log.read()
    assert dynamo.frames_started() - frames == 3, "two graphs, then the limit"
    assert [c.recompile_limit_hit for c in found] == [False, False, True]
    assert found[0].recompile_reason is None
    assert found[0].function is not None
    assert found[0].function.startswith("forward (")
    assert "test_dynamo.py" in found[0].function
    assert found[1].recompile_reason == "tensor 'x' size mismatch at index 0. expected 3, actual 4"
    assert found[2].failure is not None
    limit_failures = ("Unsupported: Dynamo recompile limit", "RecompileLimitExceeded: recompile_limit")  # >= / < 2.11
    assert found[2].failure.startswith(limit_failures)
    assert found[2].function == found[0].function, "torch < 2.11 records no code for the limit: taken from the frame"
    assert dynamo.cache_entries(Scale.forward) == 2
    assert dynamo.recompile_limit() == 2
    assert log.read() == [], "each compilation is read once"


def test_graph_breaks_with_the_users_line() -> None:
    logger = logging.getLogger(torch._dynamo.symbolic_convert.graph_break_log.name)
    level, propagate = logger.level, logger.propagate
    recorder = dynamo.GraphBreakRecorder()
    recorder.start()
    try:
        torch.compile(Breaks().forward, backend="eager")(torch.ones(2))
    finally:
        recorder.stop()
    (found,) = recorder.breaks
    assert found.location.endswith(f"test_dynamo.py:{Breaks.forward.__code__.co_firstlineno + 2}")
    assert "print" in found.reason
    assert (logger.level, logger.propagate) == (level, propagate), "the logger is restored"
    assert not any(isinstance(h, dynamo._Handler) for h in logger.handlers)


def test_ddp_optimizer_first_bucket() -> None:
    assert dynamo.ddp_first_bucket_bytes() == torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 1024 * 1024
    from torch._dynamo.backends.distributed import DDPOptimizer

    with pytest.raises(AssertionError, match="First bucket should be smaller/equal to other buckets"):
        DDPOptimizer(bucket_bytes_cap=int(0.5 * 1024 * 1024), backend_compile_fn=lambda gm, inputs: gm)
    DDPOptimizer(bucket_bytes_cap=1024 * 1024, backend_compile_fn=lambda gm, inputs: gm)
    with torch._dynamo.config.patch(optimize_ddp=False):
        assert dynamo.ddp_first_bucket_bytes() is None


def test_cpp_compiler_found_here() -> None:
    found = eager.cpp_compiler()
    assert found, "inductor found no C++ compiler on this machine (the benchmarks need one)"


def test_module_compile_leaves_its_mark() -> None:
    module = nn.Linear(2, 2)
    assert not dynamo.compiled_by_module_compile(module)
    module.compile(backend="eager")
    assert dynamo.compiled_by_module_compile(module)
    frames = dynamo.frames_started()
    module(torch.ones(1, 2))
    skipped = dynamo.module_compile_skips_torch_modules()  # torch < 2.14: dynamo skips torch's own modules
    assert (dynamo.frames_started() == frames) is skipped, f"torch's own module: dynamo skipped it: {skipped}"


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(4))  # 1 MiB of weights each

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class DDPSplitRecorder(dynamo._LogRecorder):
    """How many sub-graphs (one per DDP bucket) DDPOptimizer split each compiled graph into, from its INFO record."""

    _target = "torch._dynamo.backends.distributed:log"

    def __init__(self) -> None:
        self.splits: list[int] = []
        super().__init__(logging.INFO, self._buckets, self.splits.append)

    @staticmethod
    def _buckets(message: str) -> int | None:
        match = re.search(r"DDPOptimizer used bucket cap \d+ and created (\d+) buckets", message)
        return None if match is None else int(match[1])


def _ddp_split_count(tmp_path: Any, bucket_cap_mb: float) -> list[int]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.FileStore(str(tmp_path / f"store{bucket_cap_mb}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        inner = Layers()
        inner.compile(backend="aot_eager")  # compiled inside DDP's forward: where DDPOptimizer splits
        model = DistributedDataParallel(inner, bucket_cap_mb=bucket_cap_mb)
        with DDPSplitRecorder() as recorder:
            model(torch.ones(2, 512)).sum().backward()
        # torch 2.13: the group's destructor (when the model goes) joins gloo's worker thread holding the GIL, while
        # that thread may wait for the GIL to free the last all-reduce (a hang seen once in the suite)
        shutdown.kept_barrier(timedelta(seconds=60))
        return recorder.splits
    finally:
        dist.destroy_process_group()


def test_ddp_optimizer_sub_graphs_follow_bucket_cap_mb(tmp_path: Any) -> None:
    """Four 1 MiB layers: one sub-graph per layer at 1 MB buckets; two at torch's default 25 MB (DDP's first bucket
    is capped at 1 MiB, the other layers share the next)."""
    logger = logging.getLogger("torch._dynamo.backends.distributed")
    before = (logger.level, logger.propagate, list(logger.handlers))
    assert _ddp_split_count(tmp_path, 1) == [4]
    torch.compiler.reset()
    assert _ddp_split_count(tmp_path, 25) == [2]
    assert (logger.level, logger.propagate, list(logger.handlers)) == before, "the logger was not restored"


def test_recompile_reason_is_the_relevant_guard_of_every_cached_graph() -> None:
    """Dynamo's record names the newest cached graph's failed guard only (here evaluation's grad mode); the reader
    reads every cached graph's from ``guard_failures`` and puts a mode switch last."""
    compiled = torch.compile(Scale(), backend="eager", dynamic=False)
    log = dynamo.CompilationLog()
    graphs = dynamo.graphs_compiled()
    compiled(torch.ones(3, 4))
    with torch.no_grad():
        compiled(torch.ones(3, 4))
    compiled(torch.ones(5, 4))
    first, evaluation, longer = log.read()
    assert first.recompile_reason is None
    assert evaluation.recompile_reason == "GLOBAL_STATE changed: grad_mode"
    assert longer.recompile_reason == "tensor 'x' size mismatch at index 0. expected 3, actual 5"
    assert longer.other_reasons == ("GLOBAL_STATE changed: grad_mode",)
    assert dynamo.graphs_compiled() - graphs == 3


def test_graphs_compiled_counts_both_sides_of_a_graph_break() -> None:
    graphs, frames = dynamo.graphs_compiled(), dynamo.frames_started()
    torch.compile(Breaks(), backend="eager")(torch.ones(2))
    assert dynamo.graphs_compiled() - graphs == 2
    assert dynamo.frames_started() - frames >= 2
