"""What Gaudi's features buy: fused kernels on and off, fast DDP against DDP, regional against whole compile.

``python -m benchmarks.features [--quick] [--backend aot_eager|inductor] [--out DIR]``

Three measurements, on the Hugging Face models of :mod:`benchmarks.hf_models` (built from configs, random weights):

1. **Kernels.** The 2-layer LLaMA (:func:`benchmarks.hf_models.build`, ``attn_implementation="sdpa"``, so its
   attention calls torch's ``scaled_dot_product_attention``) trained from the same seed on the same batches with
   and without :class:`lightning_gaudi.callbacks.FusedKernels`, ``accelerator="hpu"``, in this process, alternated in
   rotating order. Per variant: the calls per step of the seam's ``sdpa``, ``rms_norm`` and ``rope`` (counted by
   wrapping them on the :func:`lightning_gaudi.hpu.get_backend` instance for the fit: the plain run must show none,
   the fused run every attention, norm and rotary embedding), the largest absolute difference between the two runs'
   losses over all steps (the kernels must not change the numerics beyond float tolerance), and steps/s after
   warm-up (meaningful on a Gaudi only: in emulation the seam runs the model's own math on the CPU).
2. **Fast DDP against DDP in compile mode.** The same LLaMA on 2 fresh processes per strategy (Lightning's popen
   launcher; gloo in emulation, HCCL on Gaudi), ``hpu_parallel`` against ``hpu_fast_ddp`` (both with the same
   ``bucket_cap_mb``, small enough that the model's gradients fill several buckets, as a real model's do), with
   ``HPUCompile()`` (backend ``aot_eager`` in emulation unless ``--backend``; ``hpu_backend`` on Gaudi). Rank 0
   reports the graphs dynamo compiled (``counters["stats"]["unique_graphs"]``), the sub-graphs DDPOptimizer split
   them into (:class:`lightning_gaudi.callbacks.dynamo.DDPSplitRecorder`; fast DDP has no DDP wrapper, so nothing is
   split), its mean step time after warm-up, and its final weights: the two strategies start from the same seed on
   the same data and must end with the same weights to float tolerance (the largest absolute difference is
   reported, with that of rank 0's losses).
3. **Regional against whole compile** of a 12-layer default-config LLaMA: :func:`benchmarks.regional_decoder.measure`
   in one fresh process, for the whole model, ``HPUCompile(regional=True)`` and regional with the KV cache left on:
   graphs compiled, graphs of the decoder layer's forward, layers left uncompiled, first-step and later-step time.

In emulation the point is the numerics and the graph counts, not the speed (the "device" is this CPU); on a Gaudi
(:mod:`benchmarks.gaudi` runs this module after the suite, with no emulation: the seam and the compiler are the real
bridge's) the times are what the features buy. Writes ``features.json`` and ``features.md`` to ``--out`` (default
``benchmarks/results``; ``--quick``: ``benchmarks/out``, a smoke run whose numbers mean nothing) and prints the
tables. A fresh process runs ``python -m benchmarks.features --worker ddp STRATEGY STEPS WARMUP BUCKET_MB OUT`` or
``--worker regional LAYERS STEPS OUT``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor

import lightning_gaudi  # noqa: F401 - registers the "hpu" accelerator and strategies
from benchmarks.common import (
    StepTimer,
    child_env,
    emulation,
    fmt_summary,
    log,
    machine,
    machine_line,
    parameter_count,
    quiet,
    ratio_summary,
    rotation,
    run_worker,
    summarize,
    trainer_kwargs,
)
from benchmarks.hf_models import CausalLM, _quiet_libraries, tokens
from lightning_gaudi import hpu
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV

HERE = Path(__file__).resolve().parent
MODEL = "llama"
#: The seam's kernel entry points that FusedKernels routes to.
SEAM_KERNELS = ("sdpa", "rms_norm", "rope")
KERNEL_VARIANTS = ("plain", "fused")
DDP_STRATEGIES = ("hpu_parallel", "hpu_fast_ddp")
#: Losses and weights of two runs that must agree: float32 arithmetic in another order, no more.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Settings:
    """How long each measurement runs: the defaults take about a minute on 2 cores (53 s in the last run),
    :meth:`quick` a smoke run. Steps are per fit; the timed window starts after the warm-up steps."""

    kernels_steps: int = 40
    kernels_warmup: int = 10
    kernels_repetitions: int = 3
    ddp_steps: int = 50
    ddp_warmup: int = 10
    #: The LLaMA's 1.9 MiB of float32 gradients in 2 buckets (HPUCompile refuses less than 1 under DDP: torch's
    #: DDPOptimizer wants a first bucket, 1 MiB, no larger than the others).
    ddp_bucket_cap_mb: float = 1.0
    regional_layers: int = 12
    regional_steps: int = 4
    regional_variants: tuple[str, ...] = ("whole", "regional", "regional, use_cache=True")

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            kernels_steps=4,
            kernels_warmup=1,
            kernels_repetitions=1,
            ddp_steps=4,
            ddp_warmup=2,
            regional_layers=3,
            regional_steps=2,
            regional_variants=("whole", "regional"),
        )


def _llama() -> CausalLM:
    """The LLaMA of :mod:`benchmarks.hf_models` with torch's SDPA as its attention (what FusedKernels routes)."""
    module = CausalLM(MODEL)
    model: Any = module.model
    if model.config._attn_implementation != "sdpa":
        model.set_attn_implementation("sdpa")
    return module


class LossRecorder(Callback):
    """Every training step's loss, kept on the device (no host sync per step) and read once at the end."""

    def __init__(self) -> None:
        self._losses: list[Tensor] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._losses.append(outputs["loss"].detach())

    def losses(self) -> list[float]:
        return [float(value) for value in torch.stack(self._losses).float().cpu()]


def max_abs_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- 1. kernels on and off, in this process


@contextlib.contextmanager
def seam_calls(backend: hpu.Backend) -> Iterator[dict[str, int]]:
    """Counts calls of the backend's ``sdpa``, ``rms_norm`` and ``rope`` (wrapped on the instance) in the block."""
    calls = dict.fromkeys(SEAM_KERNELS, 0)

    def counted(name: str, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return kernel(*args, **kwargs)

    for name in SEAM_KERNELS:
        if name in vars(backend):
            raise RuntimeError(f"the backend's {name} is already wrapped")
        setattr(backend, name, functools.partial(counted, name, getattr(backend, name)))
    try:
        yield calls
    finally:
        for name in SEAM_KERNELS:
            delattr(backend, name)


def fit_kernels(fused: bool, steps: int, warmup: int) -> dict[str, Any]:
    """One fit of the LLaMA on the HPU of this process's settings, with or without FusedKernels."""
    from lightning_gaudi.callbacks import FusedKernels

    backend = hpu.get_backend()
    seed_everything(0, verbose=False)
    module, losses = _llama(), LossRecorder()
    timer = StepTimer(warmup, steps - 1, backend.synchronize)
    callbacks: list[Callback] = [FusedKernels()] if fused else []
    trainer = Trainer(**trainer_kwargs(steps, accelerator="hpu", callbacks=[*callbacks, losses, timer]))
    with seam_calls(backend) as calls, quiet():
        trainer.fit(module, tokens(steps))
    return {
        "losses": losses.losses(),
        "seam_calls_per_step": {name: count / steps for name, count in calls.items()},
        "steps_per_s": timer.steps_per_second(),
        "steps_per_cpu_s": timer.steps_per_cpu_second(),
    }


def kernels(settings: Settings) -> dict[str, Any]:
    """Measurement 1: plain and fused fits alternated in rotating order."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in KERNEL_VARIANTS}
    for repetition in range(settings.kernels_repetitions):
        for variant in rotation(KERNEL_VARIANTS, repetition):
            run = fit_kernels(variant == "fused", settings.kernels_steps, settings.kernels_warmup)
            runs[variant].append(run)
            calls = ", ".join(f"{name} {count:g}" for name, count in run["seam_calls_per_step"].items())
            speed = f"{run['steps_per_s']:.1f} steps/s"
            log(f"  kernels rep {repetition + 1} {variant:>5}: seam calls/step {calls}; {speed}")
    plain, fused = runs["plain"], runs["fused"]
    differences = [max_abs_difference(p["losses"], f["losses"]) for p, f in zip(plain, fused, strict=True)]
    return {
        "steps": settings.kernels_steps,
        "warmup_steps": settings.kernels_warmup,
        "repetitions": settings.kernels_repetitions,
        # the counts do not depend on the repetition: the first one's
        "seam_calls_per_step": {variant: runs[variant][0]["seam_calls_per_step"] for variant in KERNEL_VARIANTS},
        "loss_max_abs_diff": max(differences),
        "first_loss": plain[0]["losses"][0],
        "last_loss": {variant: runs[variant][0]["losses"][-1] for variant in KERNEL_VARIANTS},
        "steps_per_s": {variant: summarize([r["steps_per_s"] for r in runs[variant]]) for variant in KERNEL_VARIANTS},
        "fused/plain": ratio_summary([r["steps_per_s"] for r in fused], [r["steps_per_s"] for r in plain]),
    }


# ---------------------------------------------------------------- 2. fast DDP against DDP, compiled, fresh pairs


def ddp_worker(strategy: str, steps: int, warmup: int, bucket_cap_mb: float, out: Path) -> None:
    """One compiled fit on 2 processes; rank 0 writes its counts and times to ``out``, its weights beside it."""
    from torch._dynamo.utils import counters

    from lightning_gaudi import HPUParallelStrategy
    from lightning_gaudi.callbacks import HPUCompile, dynamo

    torch.set_num_threads(1)
    _quiet_libraries()
    seed_everything(0, verbose=False)
    module, losses = _llama(), LossRecorder()
    timer = StepTimer(warmup, steps - 1, hpu.get_backend().synchronize)
    parallel = HPUParallelStrategy(bucket_cap_mb=bucket_cap_mb, fast_ddp=strategy == "hpu_fast_ddp")
    kwargs = trainer_kwargs(steps, accelerator="hpu", devices=2, strategy=parallel, enable_progress_bar=False)
    trainer = Trainer(**kwargs, callbacks=[HPUCompile(), losses, timer])
    with dynamo.DDPSplitRecorder() as recorder:
        trainer.fit(module, tokens(steps, processes=2))
    if trainer.global_rank != 0:
        return
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, out.with_suffix(".pt"))
    result = {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "ddp_splits": recorder.splits,
        "step_ms": 1000 / timer.steps_per_second(),
        "losses": losses.losses(),
        "world_size": trainer.world_size,
    }
    out.write_text(json.dumps(result))


def fast_ddp(settings: Settings, env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Measurement 2: each strategy in a fresh pair of processes; then the two runs' weights compared."""
    runs: dict[str, dict[str, Any]] = {}
    weights: dict[str, dict[str, Tensor]] = {}
    for strategy in DDP_STRATEGIES:
        result = scratch / f"ddp-{strategy}.json"
        steps, warmup = str(settings.ddp_steps), str(settings.ddp_warmup)
        args = ["ddp", strategy, steps, warmup, str(settings.ddp_bucket_cap_mb), str(result)]
        run = run_worker("benchmarks.features", args, result, env)
        weights[strategy] = torch.load(result.with_suffix(".pt"))
        result.with_suffix(".pt").unlink()
        run["sub_graphs"] = sum(run["ddp_splits"])
        runs[strategy] = run
        log(
            f"  ddp {strategy:>12}: {run['graphs']} graphs, DDPOptimizer splits {run['ddp_splits']},"
            f" {run['step_ms']:.1f} ms/step"
        )
    ddp_weights, fast_weights = (weights[strategy] for strategy in DDP_STRATEGIES)
    weight_diff = max(float((ddp_weights[k] - fast_weights[k]).abs().max()) for k in ddp_weights)
    ddp_losses, fast_losses = (runs[strategy].pop("losses") for strategy in DDP_STRATEGIES)
    for strategy, losses in zip(DDP_STRATEGIES, (ddp_losses, fast_losses), strict=True):
        runs[strategy]["first_loss"], runs[strategy]["last_loss"] = losses[0], losses[-1]
    return {
        "steps": settings.ddp_steps,
        "warmup_steps": settings.ddp_warmup,
        "bucket_cap_mb": settings.ddp_bucket_cap_mb,
        "gradient_mib": parameter_count(_llama()) * 4 / 2**20,
        "strategies": runs,
        "weights_max_abs_diff": weight_diff,
        "loss_max_abs_diff": max_abs_difference(ddp_losses, fast_losses),
        "fast/ddp step time": runs["hpu_fast_ddp"]["step_ms"] / runs["hpu_parallel"]["step_ms"],
    }


# ---------------------------------------------------------------- 3. regional against whole, one fresh process


def regional_worker(layers: int, steps: int, variants: list[str], out: Path) -> None:
    """:func:`benchmarks.regional_decoder.measure` for each variant, in this (fresh) process."""
    from benchmarks import regional_decoder

    torch.set_num_threads(1)
    _quiet_libraries()
    results = {name: regional_decoder.measure(regional_decoder.VARIANTS[name], layers, steps) for name in variants}
    out.write_text(json.dumps(results))


def regional(settings: Settings, env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Measurement 3: the variants of :mod:`benchmarks.regional_decoder` in one fresh process."""
    result = scratch / "regional.json"
    variants = "|".join(settings.regional_variants)
    args = ["regional", str(settings.regional_layers), str(settings.regional_steps), variants, str(result)]
    runs = run_worker("benchmarks.features", args, result, env)
    for name, run in runs.items():
        log(
            f"  regional {name:>24}: {run['graphs']} graphs, {run['uncompiled_layers']} uncompiled layers,"
            f" first step {run['first_step_s']:.2f} s, later {run['later_step_s']:.4f} s"
        )
    return {"layers": settings.regional_layers, "steps": settings.regional_steps, "variants": runs}


# ---------------------------------------------------------------- the tables


def table(results: dict[str, Any]) -> str:
    """The three tables as markdown, headed by the machine."""
    gaudi = results["gaudi"]
    speed_note = "" if gaudi else " (emulation: the CPU's speed, not Gaudi's; meaningful on a Gaudi only)"
    lines = [
        f"What Gaudi's features buy, {'on a Gaudi' if gaudi else 'in eager emulation'};"
        f" compile backend {results['backend']}."
        + (" Quick run: the numbers mean nothing." if results["quick"] else ""),
        f"Machine: {machine_line(results['machine'])}. The run took {results['seconds']:.0f} s.",
        "",
    ]
    k = results["kernels"]
    lines += [
        f"1. FusedKernels on the 2-layer LLaMA ({results['parameters'] / 1e6:.2f}M parameters, batches of 8 x 64"
        f" tokens, AdamW): {k['steps']} steps from the same seed, {k['repetitions']} repetition(s) in rotating order;"
        f" steps/s after {k['warmup_steps']} warm-up{speed_note}.",
        "",
        "| variant | sdpa calls/step | rms_norm calls/step | rope calls/step | last loss | steps/s |",
        "|---|---|---|---|---|---|",
    ]
    for variant in KERNEL_VARIANTS:
        calls = k["seam_calls_per_step"][variant]
        lines.append(
            f"| `{variant}` | {calls['sdpa']:g} | {calls['rms_norm']:g} | {calls['rope']:g}"
            f" | {k['last_loss'][variant]:.6f} | {fmt_summary(k['steps_per_s'][variant])} |"
        )
    lines += [
        "",
        f"Largest loss difference, fused against plain, over all steps: {k['loss_max_abs_diff']:.2e}"
        f" (first loss {k['first_loss']:.4f}); fused / plain steps/s {fmt_summary(k['fused/plain'], '.3f')}.",
        "",
    ]
    d = results["fast_ddp"]
    lines += [
        f"2. `hpu_fast_ddp` against `hpu_parallel` with `HPUCompile()`, 2 processes, the same LLaMA,"
        f" bucket_cap_mb={d['bucket_cap_mb']:g} ({d['gradient_mib']:.2f} MiB of gradients), {d['steps']} steps from"
        f" the same seed on the same data; rank 0's mean step time after {d['warmup_steps']} warm-up{speed_note}.",
        "",
        "| strategy | graphs compiled | DDPOptimizer sub-graphs (per graph) | first loss | last loss | step ms |",
        "|---|---|---|---|---|---|",
    ]
    for strategy, run in d["strategies"].items():
        splits = ", ".join(map(str, run["ddp_splits"])) or "none"
        losses = f"{run['first_loss']:.6f} | {run['last_loss']:.6f}"
        lines.append(
            f"| `{strategy}` | {run['graphs']} | {run['sub_graphs']} ({splits}) | {losses} | {run['step_ms']:.1f} |"
        )
    lines += [
        "",
        f"Final weights, largest difference between the strategies: {d['weights_max_abs_diff']:.2e}; rank 0's"
        f" losses: {d['loss_max_abs_diff']:.2e}; fast / DDP step time {d['fast/ddp step time']:.3f}.",
        "",
    ]
    r = results["regional"]
    lines += [
        f"3. Regional against whole compile of a {r['layers']}-layer default-config LLaMA, {r['steps']} steps"
        f" (benchmarks/regional_decoder.py){speed_note}.",
        "",
        "| variant | graphs compiled | graphs of the layer's forward | uncompiled layers | first step s | later s |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in r["variants"].items():
        lines.append(
            f"| {name} | {run['graphs']} | {run['layer_graphs']} | {run['uncompiled_layers']}"
            f" | {run['first_step_s']:.2f} | {run['later_step_s']:.4f} |"
        )
    return "\n".join([*lines, ""])


# ---------------------------------------------------------------- the run


def run(quick: bool, out: Path, backend: str = "aot_eager", gaudi: bool = False) -> dict[str, Any]:
    """All three measurements; writes ``features.json`` and ``features.md`` to ``out``.

    ``gaudi``: the real bridge (no emulation anywhere; compiled children run with ``PT_HPU_LAZY_MODE=0`` and the
    plugin's own compile backend); otherwise eager emulation with ``backend`` for ``torch.compile``.
    """
    if not gaudi:
        torch.set_num_threads(1)  # one emulated card per core
    _quiet_libraries()
    settings = Settings.quick() if quick else Settings()
    started = time.perf_counter()
    env = child_env(PT_HPU_LAZY_MODE="0") if gaudi else child_env(LIGHTNING_GAUDI_EMULATE="eager")
    if not gaudi:
        env[COMPILE_BACKEND_ENV] = backend
    results: dict[str, Any] = {
        "quick": quick,
        "gaudi": gaudi,
        "backend": "hpu_backend" if gaudi else backend,
        "command": " ".join(["python -m benchmarks." + ("gaudi" if gaudi else "features"), *sys.argv[1:]]),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": asdict(settings),
        "parameters": parameter_count(_llama()),
        "section_seconds": {},
    }
    with tempfile.TemporaryDirectory(prefix="features_") as scratch:
        measurements: dict[str, Callable[[], dict[str, Any]]] = {
            "kernels": lambda: kernels(settings),
            "fast_ddp": lambda: fast_ddp(settings, env, Path(scratch)),
            "regional": lambda: regional(settings, env, Path(scratch)),
        }
        for name, measure in measurements.items():
            log(f"[features: {name}]")
            begin = time.perf_counter()
            with emulation(None if gaudi else "eager"):
                results[name] = measure()
            results["section_seconds"][name] = time.perf_counter() - begin
    results["seconds"] = time.perf_counter() - started
    results["load_average_at_end"] = machine()["load_average_1min"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "features.json").write_text(json.dumps(results, indent=1))
    (out / "features.md").write_text(table(results))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.features", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; its numbers mean nothing")
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend in emulation (aot_eager)")
    parser.add_argument("--out", type=Path, default=None, help="where features.json and .md go")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        if kind == "ddp":
            strategy, steps, warmup, bucket_cap_mb, out = rest
            ddp_worker(strategy, int(steps), int(warmup), float(bucket_cap_mb), Path(out))
        elif kind == "regional":
            layers, steps, variants, out = rest
            regional_worker(int(layers), int(steps), variants.split("|"), Path(out))
        else:
            parser.error(f"--worker {kind!r}: the kinds are ddp and regional")
        return
    out = args.out or HERE / ("out" if args.quick else "results")
    print(table(run(args.quick, out, args.backend)))
    log(f"wrote {out / 'features.json'} and features.md")


if __name__ == "__main__":
    main()
