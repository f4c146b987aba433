"""The same suite on a real Gaudi node: ``python -m benchmarks.gaudi`` (Intel's bridge, no emulation).

NOT RUN HERE: no Gaudi is reachable from the machines this project was built on, so this script has never run on
hardware. It runs the sections of :mod:`benchmarks.run` with ``LIGHTNING_GAUDI_EMULATE`` unset, so every HPU call
goes to ``habana_frameworks`` through the seam, and prints the same table. Differences from the emulated run:

- overhead: no ``stock`` variants (stock Lightning 2.6 has no HPU; a CPU figure would not compare), so the table
  shows the plugin against the hand-written loop (which calls ``mark_step`` itself in lazy mode);
- lazy: runs only with ``PT_HPU_LAZY_MODE=1``; graph compilations come from the bridge's metrics, host syncs and
  mark_steps are not counted by the bridge ("not counted");
- DDP: 2 cards over HCCL; memory is the card's ``memory_stats()["InUse"]`` at the end of backward;
- torch keeps its own thread count.

Then it runs :mod:`benchmarks.features` (fused kernels on and off, ``hpu_fast_ddp`` against ``hpu_parallel`` in
compile mode, regional against whole compile) the same way: the seam and the compiler are the bridge's, the compiled
runs are fresh processes with ``PT_HPU_LAZY_MODE=0`` and ``hpu_backend``, and here the times are what the features
buy. It writes ``features.json`` and ``features.md`` beside the suite's results.

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
    if not hpu.get_backend().is_lazy() and "lazy" in args.only:
        print("PT_HPU_LAZY_MODE=0 (eager): leaving out the lazy section; set PT_HPU_LAZY_MODE=1 to run it.")
        args.only = [name for name in args.only if name != "lazy"]
    results = run.run_suite(args, gaudi=True)
    print(run.write(results, args.out))
    from benchmarks import features

    print(features.table(features.run(args.quick, args.out, gaudi=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
