"""What the checksum index of sharded checkpoints costs at save and at resume, on a checkpoint of at least 1 GiB.

``python -m benchmarks.checksums [--gib 1] [--rounds 3] [--dir DIR] [--out DIR]``. One process writes a torch
distributed checkpoint of GIB GiB of float32 (64 MiB tensors), staged and renamed into place as the sharded
strategies do (``save_staged``), without the index (``plain``: the checkpoints before it) and with it
(``checksummed``: each file's CRC-32 read back once written, the index merged before the rename); then resumes it:
``verify_checkpoint`` (shard lengths, or every byte's CRC-32) and ``dcp.load`` into preallocated tensors. Variants
alternate in rotating order; wall seconds, median (min-max). torch's writer fsyncs the shards; the CRC-32s at save and
at resume read from the page cache (the checkpoint fits in memory), so they cost CPU time, not a disk's. Writes
``checksums.json`` and ``checksums.md`` (default: ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from benchmarks.common import machine, machine_line, rotation, summarize
from lightning_gaudi.resume import verify_checkpoint
from lightning_gaudi.strategies._staged import save_staged

VARIANTS = ("plain", "checksummed")
RESULTS = Path(__file__).parent / "results"
TENSOR_ELEMENTS = 16 * 2**20  # 64 MiB of float32


class _OneRank:
    is_global_zero = True
    global_rank = 0
    timeout = timedelta(minutes=10)

    @staticmethod
    def broadcast(obj: Any, src: int = 0) -> Any:
        return obj

    @staticmethod
    def barrier(name: str | None = None) -> None:
        return None


def _save(variant: str, state: dict[str, Any], path: Path) -> float:
    def write(staging: Path) -> None:
        dcp.save(state, checkpoint_id=staging)
        torch.save({"global_step": 1, "epoch": 0}, staging / "meta.pt")

    start = time.perf_counter()
    save_staged(_OneRank(), path, write, checksums=variant == "checksummed")
    return time.perf_counter() - start


def _resume(path: Path, target: dict[str, Any]) -> tuple[float, bool]:
    start = time.perf_counter()
    checked = verify_checkpoint(path).crc_checked
    dcp.load(target, checkpoint_id=path)
    return time.perf_counter() - start, checked


def run(gib: float, rounds: int, directory: Path, out: Path) -> dict[str, Any]:
    facts = machine()
    tensors = max(1, round(gib * 2**30 / (4 * TENSOR_ELEMENTS)))
    generator = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.rand(TENSOR_ELEMENTS, generator=generator) for i in range(tensors)}}
    target = {"model": {name: torch.empty_like(t) for name, t in state["model"].items()}}
    times: dict[str, dict[str, list[float]]] = {v: {"save_s": [], "resume_s": []} for v in VARIANTS}
    checked: dict[str, bool] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        for index in range(rounds):
            for variant in rotation(VARIANTS, index):
                path = Path(tmp) / f"{variant}.ckpt"
                times[variant]["save_s"].append(_save(variant, state, path))
                seconds, checked[variant] = _resume(path, target)
                times[variant]["resume_s"].append(seconds)
                assert all(torch.equal(target["model"][n], t) for n, t in state["model"].items())
                shutil.rmtree(path)
    size = tensors * TENSOR_ELEMENTS * 4
    result = {
        "machine": facts,
        "bytes": size,
        "tensors": tensors,
        "rounds": rounds,
        "took_s": time.perf_counter() - start,
        "crc_checked": checked,
        "variants": {v: {k: summarize(values) for k, values in t.items()} for v, t in times.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "checksums.json").write_text(json.dumps(result, indent=2))
    (out / "checksums.md").write_text(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    variants = result["variants"]

    def cell(summary: dict[str, Any]) -> str:
        return f"{summary['median']:.2f} ({summary['min']:.2f}-{summary['max']:.2f})"

    lines = [
        f"Sharded checkpoint of {result['bytes'] / 2**30:.2f} GiB ({result['tensors']} float32 tensors of 64 MiB), one"
        f" process, {result['rounds']} rounds in rotating order; wall seconds, median (min-max).",
        f"Machine: {machine_line(result['machine'])}. The run took {result['took_s']:.0f} s.",
        "",
        "| variant | save s | resume s (verify + load) | CRC-32s checked at resume |",
        "|---|---|---|---|",
    ]
    for name, summary in variants.items():
        lines.append(
            f"| `{name}` | {cell(summary['save_s'])} | {cell(summary['resume_s'])} | {result['crc_checked'][name]} |"
        )
    plain, checksummed = variants["plain"], variants["checksummed"]
    lines += [
        "",
        f"Checksummed / plain, medians: save {checksummed['save_s']['median'] / plain['save_s']['median']:.2f},"
        f" resume {checksummed['resume_s']['median'] / plain['resume_s']['median']:.2f}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the checkpoints go")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    print(table(run(args.gib, args.rounds, args.dir, args.out)))


if __name__ == "__main__":
    main()
