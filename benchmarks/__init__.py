"""Benchmarks of engine's kernels against their peers (see shared PERF.md for the method).

* ``harness``  -- timing, copy bandwidth, byte counts, the backend switcher, JSON and tables.
* ``cases``    -- the benchmarked computations: engine's backends and the peers, with their checks.
* ``run``      -- the sweep the GPU session runs (``python benchmarks/run.py --suite all``).
* ``tune``     -- config sweep of the Triton norm kernels.
* ``plot``     -- PNGs from one or more ``run`` JSON files.
* ``test_bench_norms`` -- the same cases as pytest-benchmark tests.
"""
