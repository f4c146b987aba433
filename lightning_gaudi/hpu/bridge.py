"""The real Intel Gaudi bridge (``habana_frameworks.torch``), imported on first use; the only module that imports it."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cached_property
from types import ModuleType
from typing import Any

from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from torch.profiler import ProfilerActivity

from lightning_gaudi.hpu import runtime
from lightning_gaudi.hpu.backend import Backend, ClipNorm, LazyCounters
from lightning_gaudi.hpu.dtypes import int64_supported
from lightning_gaudi.hpu.fp8 import NeuralCompressor, TransformerEngine

#: The bridge's variables that print its own log, CPU fallbacks included.
BRIDGE_LOG_HINT = "ENABLE_CONSOLE=true LOG_LEVEL_PT_FALLBACK=1"


class _BridgeClipNorm(ClipNorm):
    def __init__(self, fused: Any) -> None:
        self._fused = fused

    def clip_norm(self, parameters: Iterable[Tensor] | Tensor) -> Tensor:
        return self._fused.clip_norm(parameters)


#: The rendezvous importing Intel's bridge sets where the launcher set none (bridge 1.19: ``torch/__init__.py:55``
#: imports ``distributed/hccl/__init__.py``, whose ``initialize_distributed_hpu()`` sets them, lines 78-81, 113):
#: Lightning would take 12345 for the launcher's port, and two jobs on one node would share it.
BRIDGE_RENDEZVOUS = {"MASTER_ADDR": "localhost", "MASTER_PORT": "12345"}


@contextmanager
def keep_rendezvous() -> Iterator[None]:
    """Runs code that may import Intel's bridge and takes back the :data:`BRIDGE_RENDEZVOUS` values the import added
    (those the user or the launcher set stay), so Lightning picks a free port as it does without the bridge."""
    before = {name: os.environ.get(name) for name in BRIDGE_RENDEZVOUS}
    try:
        yield
    finally:
        for name, value in BRIDGE_RENDEZVOUS.items():
            if before[name] is None and os.environ.get(name) == value:
                del os.environ[name]


def _started_with() -> dict[str, str] | None:
    """The environment this process was started with (Linux's ``/proc/self/environ``), or ``None``."""
    try:
        with open("/proc/self/environ", "rb") as file:
            raw = file.read()
    except OSError:
        return None
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


def forget_loaded_bridge_rendezvous() -> None:
    """Where the bridge was imported before the seam could watch (torch's device autoload, the user's script): removes
    the :data:`BRIDGE_RENDEZVOUS` values the process was not started with."""
    started = _started_with()
    if started is None:
        return
    for name, value in BRIDGE_RENDEZVOUS.items():
        if os.environ.get(name) == value and name not in started:
            del os.environ[name]


def _pin_the_only_visible_card(world_size: int, local_rank: int) -> None:
    """Sets ``HLS_MODULE_ID`` to the one visible card of a process that is not its node's first (a Ray ``{"HPU": 1}``
    worker): the bridge would pick ``HABANA_VISIBLE_MODULES[local_rank]`` and stop on an assertion (bridge 1.19,
    ``distributed/hccl/__init__.py:29-31, 40-47``)."""
    visible = os.environ.get("HABANA_VISIBLE_MODULES")
    if visible is None or "HLS_MODULE_ID" in os.environ or world_size == 1:
        return
    cards = [card.strip() for card in visible.split(",") if card.strip()]
    if len(cards) == 1 and local_rank >= 1:
        os.environ["HLS_MODULE_ID"] = cards[0]


def _stat(metric: Any, tag: str, default: Any) -> Any:
    return default if metric is None else dict(metric.stats()).get(tag, default)


class HabanaBackend(Backend):
    """A Gaudi card driven through Intel's bridge."""

    name = "habana"
    emulated = False
    device_type = "hpu"
    autocast_device_type: str | None = "hpu"
    collective_backend = "hccl"
    compile_backend = "hpu_backend"
    log_hint = BRIDGE_LOG_HINT

    def __init__(self) -> None:
        if runtime.bridge_loaded():  # loaded before lightning_gaudi could keep the launcher's rendezvous
            forget_loaded_bridge_rendezvous()

    @staticmethod
    def _import(name: str) -> ModuleType:
        with keep_rendezvous():
            return importlib.import_module(f"habana_frameworks.torch{name}")

    @cached_property
    def _core(self) -> ModuleType:
        return self._import(".core")

    @cached_property
    def _hpu(self) -> ModuleType:
        self._core  # noqa: B018 - loading core registers the device
        return self._import(".hpu")

    def is_available(self) -> bool:
        return bool(self._hpu.is_available())

    def device_count(self) -> int:
        return int(self._hpu.device_count())

    def device_name(self) -> str:
        return str(self._hpu.get_device_name())

    def is_lazy(self) -> bool:
        return bool(self._core.is_lazy())

    def int64_supported(self) -> bool:
        # the bridge's own rule (common::IsInt64Supported), which it does not expose to Python
        return int64_supported(self.is_lazy(), self.device_name())

    def mark_step(self) -> None:
        self._core.mark_step()

    def synchronize(self) -> None:
        self._hpu.synchronize()

    def memory_stats(self) -> dict[str, int]:
        return dict(self._hpu.memory_stats())

    def reset_peak_memory_stats(self) -> None:
        self._hpu.reset_peak_memory_stats()

    def init_distributed(self, world_size: int, rank: int, local_rank: int) -> None:
        hccl = self._import(".distributed.hccl")  # registers the "hccl" process-group backend
        _pin_the_only_visible_card(world_size, local_rank)
        hccl.initialize_distributed_hpu(world_size=world_size, rank=rank, local_rank=local_rank)

    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._import(".hpex.optimizers").FusedAdamW(params, **kwargs)

    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._import(".hpex.optimizers").FusedSGD(params, **kwargs)

    def fused_clip_norm(self, parameters: Iterable[Tensor], max_norm: float) -> ClipNorm:
        fused = self._import(".hpex.normalization").FusedClipNorm(parameters, max_norm)
        return _BridgeClipNorm(fused)

    def _sdpa_kernel(self) -> Any:
        return self._import(".hpex.kernels").FusedSDPA.apply

    def _rms_norm_kernel(self) -> Any:
        return self._import(".hpex.normalization").FusedRMSNorm.apply

    def _rope_kernel(self) -> Any:
        return self._import(".hpex.kernels").RotaryPosEmbeddingHelperV1.apply

    def wrap_in_hpu_graph(self, module: Module) -> Module:
        return self._hpu.wrap_in_hpu_graph(module)

    def transformer_engine(self) -> TransformerEngine:
        name = ".hpex.experimental.transformer_engine"
        return TransformerEngine(self._import(name), self._import(f"{name}.recipe"))

    def neural_compressor(self) -> NeuralCompressor:
        try:
            with keep_rendezvous():  # Intel Neural Compressor imports the bridge
                return NeuralCompressor(importlib.import_module("neural_compressor.torch.quantization"))
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"FP8 inference on a Gaudi runs through Intel Neural Compressor, which is not installed ({error})."
                " Intel's Gaudi PyTorch containers include it; elsewhere `pip install neural-compressor-pt`."
            ) from error

    def lazy_counters(self) -> LazyCounters | None:
        if not self.is_lazy():
            return None
        metric_global = self._import(".hpu.metrics").metric_global
        fallback = metric_global("cpu_fallback")
        return LazyCounters(
            graph_compilations=int(_stat(metric_global("graph_compilation"), "TotalNumber", 0)),
            cpu_fallbacks=dict(_stat(fallback, "FallbackOps", {}) or {}),
        )

    def reset_lazy_counters(self) -> None:
        if not self.is_lazy():
            return
        metric_global = self._import(".hpu.metrics").metric_global
        for name in ("graph_compilation", "cpu_fallback"):
            metric = metric_global(name)
            if metric is not None:
                metric.reset()

    def profiler_activities(self) -> list[ProfilerActivity]:
        self._core  # noqa: B018 - the bridge registers its profiler plug-in when it loads
        return [ProfilerActivity.CPU, ProfilerActivity.HPU]
