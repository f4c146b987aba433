"""The measured suite: what lightning_gaudi costs and what its Gaudi defaults buy. See ``benchmarks/README.md``.

Run ``python -m benchmarks.run`` from the repository root. One module per measurement:

- :mod:`benchmarks.overhead`: steps/s of a hand-written loop, stock Lightning on CPU and the plugin on an HPU;
- :mod:`benchmarks.lazy_mode`: host syncs, compilations and mark_steps per step in lazy mode;
- :mod:`benchmarks.ddp_knobs`: all-reduce calls against ``bucket_cap_mb``, memory with ``gradient_as_bucket_view``,
  step time with ``static_graph`` (2 processes);
- :mod:`benchmarks.fused`: fused against unfused optimizer step time;
- :mod:`benchmarks.scaling`: samples/s with 1 and 2 processes.
"""
