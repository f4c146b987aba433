"""The same suite on a real Gaudi node: ``python -m benchmarks.gaudi`` (Intel's bridge, no emulation).

NOT RUN HERE: no Gaudi is reachable from the machines this project was built on, so this script has never run on
hardware. It runs the sections of :mod:`benchmarks.run` with ``LIGHTNING_GAUDI_EMULATE`` unset, so every HPU call
goes to ``habana_frameworks`` through the seam, and prints the same table. Differences from the emulated run:

- overhead: no ``stock`` variants (stock Lightning 2.6 has no HPU; a CPU figure would not compare), so the table
  shows the plugin against the hand-written loop (which calls ``mark_step`` itself in lazy mode);
- ddp: ``hpu_parallel`` on 2 cards over HCCL, against stock Lightning DDP on the CPU;
- torch keeps its own thread count.

For the Hugging Face models and memory per rank, run :mod:`benchmarks.hf_models` and :mod:`benchmarks.sharded`.

Usage on a node with at least 2 cards, inside Intel's PyTorch container (or with its packages installed)::

    pip install -e '.[dev]' && PT_HPU_LAZY_MODE=1 python -m benchmarks.gaudi --out benchmarks/results-gaudi
"""

from __future__ import annotations

import os
import sys

from benchmarks import run


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("LIGHTNING_GAUDI_EMULATE", "").strip():
        print(
            "benchmarks.gaudi measures a real Gaudi: unset LIGHTNING_GAUDI_EMULATE (it is"
            f" {os.environ['LIGHTNING_GAUDI_EMULATE']!r}), or run `python -m benchmarks.run` for the emulated suite.",
            file=sys.stderr,
        )
        return 2
    from lightning_gaudi import hpu

    if not hpu.bridge_installed():
        print(hpu.NO_HPU_MESSAGE, file=sys.stderr)
        return 2
    args = run.parse_args(argv, gaudi=True)
    if args.out == run.HERE / "results":
        args.out = run.HERE / "results-gaudi"
    results = run.run_suite(args, gaudi=True)
    print(run.write(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
