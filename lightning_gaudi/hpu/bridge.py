"""The real Intel Gaudi bridge (``habana_frameworks.torch``), imported on first use; the only module that imports it."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import cached_property
from types import ModuleType
from typing import Any

from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from torch.profiler import ProfilerActivity

from lightning_gaudi.hpu.backend import Backend, ClipNorm, LazyCounters
from lightning_gaudi.hpu.dtypes import int64_supported
from lightning_gaudi.hpu.fp8 import NeuralCompressor, TransformerEngine


class _BridgeClipNorm(ClipNorm):
    def __init__(self, fused: Any) -> None:
        self._fused = fused

    def clip_norm(self, parameters: Iterable[Tensor] | Tensor) -> Tensor:
        return self._fused.clip_norm(parameters)


def _stat(metric: Any, tag: str, default: Any) -> Any:
    if metric is None:
        return default
    return dict(metric.stats()).get(tag, default)


class HabanaBackend(Backend):
    """A Gaudi card driven through Intel's bridge."""

    name = "habana"
    emulated = False
    device_type = "hpu"
    autocast_device_type: str | None = "hpu"
    collective_backend = "hccl"
    compile_backend = "hpu_backend"

    @staticmethod
    def _import(name: str) -> ModuleType:
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
        hccl.initialize_distributed_hpu(world_size=world_size, rank=rank, local_rank=local_rank)

    def fused_adamw(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._import(".hpex.optimizers").FusedAdamW(params, **kwargs)  # type: ignore[no-any-return]

    def fused_sgd(self, params: Any, **kwargs: Any) -> Optimizer:
        return self._import(".hpex.optimizers").FusedSGD(params, **kwargs)  # type: ignore[no-any-return]

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
        return self._hpu.wrap_in_hpu_graph(module)  # type: ignore[no-any-return]

    def transformer_engine(self) -> TransformerEngine:
        name = ".hpex.experimental.transformer_engine"
        return TransformerEngine(self._import(name), self._import(f"{name}.recipe"))

    def neural_compressor(self) -> NeuralCompressor:
        try:
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
            host_syncs=None,
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
