"""The doctor's in-process checks, run by :mod:`.worker`: each takes the backend and returns an :class:`Outcome`;
raising is a failure. Kernels are compared with their reference math, fused optimizers with torch's."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lightning_gaudi import hpu

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass
class Outcome:
    """One row of the report: ``status`` (:data:`PASS`, :data:`FAIL`, :data:`SKIPPED`), why, what was measured."""

    status: str
    reason: str = ""
    figure: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def failure(backend: hpu.Backend, error: BaseException) -> Outcome:
    """The outcome of a check that raised ``error``: its type, first line and where; an error the backend takes for
    running out of device memory (:meth:`~lightning_gaudi.hpu.Backend.is_out_of_memory`: the bridge's PT_DEVMEM
    message, torch's ``OutOfMemoryError``, an emulator host's refusal) says so first."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    what = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}{where}"
    if backend.is_out_of_memory(error):
        return Outcome(
            FAIL,
            f"out of device memory on the {backend.device_name()}: {what}. The checks need a few MiB: another process"
            " may hold the card's memory (`hl-smi` lists the processes on each card)",
        )
    return Outcome(FAIL, what)


def _max_error(found: Tensor, expected: Tensor) -> float:
    return float((found.detach().float().cpu() - expected.detach().float().cpu()).abs().max())


#: Largest error tolerated against the reference math, by dtype (bf16 keeps 8 bits of mantissa).
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2}


def _compare(name: str, run: Callable[[torch.dtype], tuple[Tensor, Tensor]]) -> Outcome:
    errors = {dtype: _max_error(*run(dtype)) for dtype in TOLERANCE}
    figure = ", ".join(f"max error {error:.1e} ({str(dtype)[6:]})" for dtype, error in errors.items())
    bad = [str(dtype)[6:] for dtype, error in errors.items() if not error <= TOLERANCE[dtype]]
    if bad:
        limits = ", ".join(f"{TOLERANCE[d]:.0e} ({str(d)[6:]})" for d in TOLERANCE)
        return Outcome(FAIL, f"{name} differs from the reference math in {', '.join(bad)} (limits {limits})", figure)
    return Outcome(PASS, f"{name} matches the reference math", figure)


def backend_check(backend: hpu.Backend) -> Outcome:
    """The device: available, how many, which generation."""
    if not backend.is_available():
        return Outcome(FAIL, f"the {backend.name} backend reports no device")
    count, name = backend.device_count(), backend.device_name()
    what = "emulated on the CPU" if backend.emulated else "Intel's bridge"
    return Outcome(
        PASS,
        f"{backend.name} backend, {what}",
        f"{count} x {name}",
        {"devices": count, "name": name, "emulated": backend.emulated},
    )


def memory_stats_check(backend: hpu.Backend) -> Outcome:
    stats = backend.memory_stats()
    missing = [key for key in hpu.MEMORY_STAT_KEYS if key not in stats]
    if missing:
        return Outcome(FAIL, f"memory_stats() lacks {missing}; it has {sorted(stats)}")
    x = torch.ones(1024, 1024, device=backend.device())
    backend.mark_step()
    backend.synchronize()
    after = backend.memory_stats()
    del x
    gib = 2**30
    figure = f"Limit {after['Limit'] / gib:.1f} GiB, InUse {after['InUse'] / gib:.2f} GiB"
    if not 0 <= after["InUse"] <= after["MaxInUse"]:
        return Outcome(FAIL, f"InUse {after['InUse']} exceeds MaxInUse {after['MaxInUse']}", figure)
    extra = sorted(set(stats) - set(hpu.MEMORY_STAT_KEYS))
    return Outcome(PASS, "the ten keys" + (f" (and {extra})" if extra else ""), figure)


def autocast_check(backend: hpu.Backend) -> Outcome:
    if backend.autocast_device_type is None:
        return Outcome(SKIPPED, f"the {backend.name} backend has no torch.autocast")
    a = torch.randn(64, 64, device=backend.device())
    with torch.autocast(backend.autocast_device_type, dtype=torch.bfloat16):
        out = a @ a
    if out.dtype != torch.bfloat16:
        return Outcome(FAIL, f"a matmul under bf16 autocast returned {out.dtype}")
    return Outcome(PASS, f"torch.autocast({backend.autocast_device_type!r}, bfloat16)", "matmul in bfloat16")


def sdpa_check(backend: hpu.Backend) -> Outcome:
    def run(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        q, k, v = (torch.randn(2, 4, 32, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
        device = backend.device()
        found = backend.sdpa(q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), is_causal=True)
        mask = torch.ones(32, 32, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-2, -1) / math.sqrt(16)).masked_fill(~mask, float("-inf"))
        return found, scores.softmax(-1) @ v

    return _compare("FusedSDPA (causal)" if not backend.emulated else "sdpa (torch's, emulated)", run)


def rms_norm_check(backend: hpu.Backend) -> Outcome:
    def run(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
        weight = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5
        found = backend.rms_norm(x.to(backend.device(), dtype), weight.to(backend.device(), dtype), 1e-6)
        return found, weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    return _compare("FusedRMSNorm" if not backend.emulated else "rms_norm (reference math, emulated)", run)


def rope_check(backend: hpu.Backend) -> Outcome:
    def run(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        x = torch.randn(2, 4, 16, 32, generator=torch.Generator().manual_seed(0))
        angles = torch.arange(16).float()[:, None] / (10000 ** (torch.arange(16).float() / 16))[None, :]
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        device = backend.device()
        found = backend.rope(x.to(device, dtype), cos.to(device, dtype), sin.to(device, dtype))
        rotated = torch.cat((-x[..., 16:], x[..., :16]), dim=-1)
        return found, x * cos + rotated * sin

    return _compare("RotaryPosEmbeddingHelperV1" if not backend.emulated else "rope (reference math, emulated)", run)


def fused_adamw_check(backend: hpu.Backend) -> Outcome:
    torch.manual_seed(0)
    reference = nn.Linear(32, 32)
    model = nn.Linear(32, 32).to(backend.device())
    model.load_state_dict(reference.state_dict())
    settings: dict[str, Any] = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.1}
    fused = backend.fused_adamw(model.parameters(), **settings)
    plain = torch.optim.AdamW(reference.parameters(), **settings)
    for step in range(5):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
        for net, optimizer, device in ((model, fused, backend.device()), (reference, plain, torch.device("cpu"))):
            optimizer.zero_grad()
            net(x.to(device)).square().mean().backward()
            optimizer.step()
            backend.mark_step()
    error = max(_max_error(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))
    figure = f"max weight difference {error:.1e} after 5 steps"
    name = type(fused).__name__
    if not error <= 1e-4:
        return Outcome(FAIL, f"{name} drifts from torch's AdamW (limit 1e-4)", figure)
    return Outcome(PASS, f"{name} matches torch.optim.AdamW", figure)


def clip_norm_check(backend: hpu.Backend) -> Outcome:
    torch.manual_seed(0)
    model = nn.Linear(32, 32).to(backend.device())
    model(torch.randn(8, 32, device=backend.device())).sum().mul(100).backward()

    def grad_norm() -> Tensor:
        return torch.linalg.vector_norm(
            torch.cat([p.grad.flatten().float().cpu() for p in model.parameters() if p.grad is not None])
        )

    expected = grad_norm()
    norm = backend.fused_clip_norm(model.parameters(), max_norm=1.0).clip_norm(model.parameters())
    after = grad_norm()
    error = abs(float(norm) - float(expected)) / float(expected)
    figure = f"norm {float(norm):.3g} (relative error {error:.1e}), clipped to {float(after):.3g}"
    if error > 1e-3 or abs(float(after) - 1.0) > 1e-2:
        return Outcome(FAIL, "the clipped norm or the returned norm is wrong", figure)
    return Outcome(PASS, "FusedClipNorm" if not backend.emulated else "torch's clip_grad_norm_ (emulated)", figure)


def fp8_check(backend: hpu.Backend) -> Outcome:
    if not backend.supports_fp8():
        return Outcome(SKIPPED, f"{backend.device_name()} has no FP8 (Gaudi 2 and later)")
    from lightning_gaudi.fp8 import FP8Recipe, FP8Training

    training = FP8Training(FP8Recipe(), backend)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(64, 64)).to(backend.device())
    model = nn.Sequential(nn.Linear(64, 64)).to(backend.device())
    model.load_state_dict(plain.state_dict())
    training.convert(model)
    error = 0.0
    for step in range(3):  # delayed scaling: the first steps fill the amax history
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step)).to(backend.device())
        with training.forward_context():
            out = model(x)
        out.float().sum().backward()
        backend.mark_step()
        expected = plain(x).detach()
        error = _max_error(out.detach(), expected) / float(expected.abs().max())
    what = "Intel's te.Linear" if not training.emulated else "emulated FP8Linear"
    figure = f"relative error {error:.1e}, E4M3 max {backend.fp8_e4m3_max():g}"
    if not error <= 0.15:
        return Outcome(FAIL, f"{what} is off the float32 result by more than FP8 allows (0.15)", figure)
    return Outcome(PASS, f"{what} under fp8 autocast", figure)


def mark_step_check(backend: hpu.Backend) -> Outcome:
    if not backend.is_lazy():
        return Outcome(SKIPPED, "mark_step is a no-op outside lazy mode")
    model = nn.Linear(64, 64).to(backend.device())
    compiled = []
    for _ in range(3):
        backend.reset_lazy_counters()
        start = time.perf_counter()
        model(torch.ones(8, 64, device=backend.device())).sum().backward()
        backend.mark_step()
        backend.synchronize()
        counters = backend.lazy_counters()
        compiled.append(counters.graph_compilations if counters is not None else -1)
    figure = f"graphs compiled per identical step: {compiled}, last step {(time.perf_counter() - start) * 1e3:.1f} ms"
    if compiled[-1] > 0:
        return Outcome(FAIL, "an identical step compiled a new graph (the cache did not hit)", figure)
    return Outcome(PASS, "the graph is cut, launched and reused", figure)


def hpu_graphs_check(backend: hpu.Backend) -> Outcome:
    if not backend.is_lazy():
        return Outcome(SKIPPED, "HPU graphs exist in lazy mode only")
    if backend.emulated:
        return Outcome(SKIPPED, "emulation has no HPU graphs (the module runs as it is)")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).to(backend.device()).eval()
    x = torch.randn(8, 64).to(backend.device())
    with torch.no_grad():
        expected = model(x).cpu()
        graphed = backend.wrap_in_hpu_graph(model)
        outputs = [graphed(x).cpu() for _ in range(3)]  # capture, then replays
    error = max(_max_error(out, expected) for out in outputs)
    if error > 1e-5:
        return Outcome(FAIL, "replayed outputs differ from the plain module's", f"max error {error:.1e}")
    return Outcome(PASS, "wrap_in_hpu_graph captures once and replays", f"max error {error:.1e}")


def throughput_check(backend: hpu.Backend, mode: str) -> Outcome:
    """A small MLP's training steps per second in ``mode`` (bf16 autocast where there is one, fused AdamW)."""
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(backend.device())
    optimizer = backend.fused_adamw(model.parameters(), lr=1e-3)
    step_model = torch.compile(model, backend=backend.compile_backend) if mode == "compile" else model
    x = torch.randn(64, 256).to(backend.device())
    target = torch.randn(64, 256).to(backend.device())
    autocast = backend.autocast_device_type

    def step() -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        if autocast is not None:
            with torch.autocast(autocast, dtype=torch.bfloat16):
                loss = (step_model(x).float() - target).square().mean()
        else:
            loss = (step_model(x) - target).square().mean()
        loss.backward()
        backend.mark_step()
        optimizer.step()
        backend.mark_step()
        return loss

    first = float(step().detach().cpu())
    for _ in range(2):  # the first steps compile
        step()
    steps = 20
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    last = float(loss.detach().cpu())
    seconds = time.perf_counter() - start
    figure = f"{steps * x.shape[0] / seconds:,.0f} samples/s ({1e3 * seconds / steps:.1f} ms/step)"
    if not math.isfinite(last) or not last < first:
        return Outcome(FAIL, f"the loss went from {first:.4g} to {last:.4g}", figure)
    precision = "bf16 autocast" if autocast is not None else "float32"
    return Outcome(PASS, f"MLP 256-1024-256, batch 64, {precision}, {type(optimizer).__name__}", figure)


#: The checks each worker group runs, by name; the group is the execution mode its process is configured for.
CHECKS: dict[str, tuple[str, Callable[[hpu.Backend], Outcome]]] = {
    "device": ("eager", backend_check),
    "memory_stats": ("eager", memory_stats_check),
    "bf16 autocast": ("eager", autocast_check),
    "FusedSDPA": ("eager", sdpa_check),
    "FusedRMSNorm": ("eager", rms_norm_check),
    "RoPE": ("eager", rope_check),
    "fused AdamW": ("eager", fused_adamw_check),
    "fused clip norm": ("eager", clip_norm_check),
    "FP8": ("eager", fp8_check),
    "throughput, eager mode": ("eager", lambda backend: throughput_check(backend, "eager")),
    "throughput, compile mode": ("compile", lambda backend: throughput_check(backend, "compile")),
    "mark_step": ("lazy", mark_step_check),
    "HPU graphs": ("lazy", hpu_graphs_check),
    "throughput, lazy mode": ("lazy", lambda backend: throughput_check(backend, "lazy")),
}
