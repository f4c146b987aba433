"""What a user decides with, measured on the emulated HPU. See ``benchmarks/README.md``.

- :mod:`benchmarks.run`: the suite, :mod:`benchmarks.overhead` (one process) and :mod:`benchmarks.ddp_overhead`
  (two processes), the plugin against stock Lightning;
- :mod:`benchmarks.sharded`: memory per rank for each sharded strategy;
- :mod:`benchmarks.hf_models`: the Hugging Face models against stock, compile cold and warm, lazy host syncs;
- :mod:`benchmarks.gaudi`: the suite on a Gaudi node.
"""
