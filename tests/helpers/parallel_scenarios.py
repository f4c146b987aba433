"""The 2-process ``hpu_parallel`` scenarios of ``tests/strategies/test_parallel_emulated.py``, one after another in
the same two processes (each Lightning-importing interpreter costs seconds of CPU to start).

Run as ``python parallel_scenarios.py OUT_DIR STEPS ACCUMULATE DDP_SETTING...`` with
``LIGHTNING_GAUDI_EMULATE=eager``; Lightning's popen launcher re-runs it for rank 1, and the process group the first
Trainer forms serves the later ones. Each ``DDP_SETTING`` is ``NAME=BUCKET_CAP_MB,GRADIENT_AS_BUCKET_VIEW,STATIC_GRAPH``
(``views=0.5,1,1``): a ``ddp_fit.py`` fit of ``STEPS`` steps into ``OUT_DIR/NAME``. Then ``syncbn_fit.py`` (``STEPS``
steps) into ``OUT_DIR/syncbn`` and ``fast_ddp_fit.py`` (``ACCUMULATE`` micro-batches a step) into
``OUT_DIR/fast_ddp``. Every scenario is a fresh seed, model, strategy, Trainer and loader, as its own script runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ddp_fit
import fast_ddp_fit
import syncbn_fit


def main() -> None:
    out, steps, accumulate, settings = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    for setting in settings:
        name, values = setting.split("=")
        bucket_cap_mb, gradient_as_bucket_view, static_graph = values.split(",")
        (out / name).mkdir(parents=True, exist_ok=True)
        ddp_fit.run(out / name, float(bucket_cap_mb), gradient_as_bucket_view == "1", static_graph == "1", steps)
    (out / "syncbn").mkdir(parents=True, exist_ok=True)
    syncbn_fit.run(out / "syncbn", steps)
    (out / "fast_ddp").mkdir(parents=True, exist_ok=True)
    fast_ddp_fit.run(out / "fast_ddp", accumulate)


if __name__ == "__main__":
    main()
