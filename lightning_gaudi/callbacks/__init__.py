"""Training-loop callbacks for Gaudi."""

from lightning_gaudi.callbacks.autocast import BF16Autocast
from lightning_gaudi.callbacks.checkpoint_lock import CheckpointLock
from lightning_gaudi.callbacks.diagnostics import GraphDiagnostics
from lightning_gaudi.callbacks.fp8_inference import FP8Inference
from lightning_gaudi.callbacks.fused_kernels import FusedKernels
from lightning_gaudi.callbacks.inference import HPUCompile, HPUGraphs
from lightning_gaudi.callbacks.mark_step import MarkStep
from lightning_gaudi.callbacks.memory_stats import MemoryStats
from lightning_gaudi.callbacks.preemption import PreemptionCheckpoint
from lightning_gaudi.callbacks.throughput import HPUThroughputMonitor

__all__ = [
    "BF16Autocast",
    "CheckpointLock",
    "FP8Inference",
    "FusedKernels",
    "GraphDiagnostics",
    "HPUCompile",
    "HPUGraphs",
    "HPUThroughputMonitor",
    "MarkStep",
    "MemoryStats",
    "PreemptionCheckpoint",
]
