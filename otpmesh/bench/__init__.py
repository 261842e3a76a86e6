"""otpmesh's benchmarks, one suite per module: ``python -m otpmesh.bench [SUITE] [options]``.

Each figure is printed beside a baseline measured in the same run (timings on shared machines
are noisy; compare ratios, not absolutes). Without a suite, or with ``core``, the call suite
runs (``otpmesh.bench.core``); ``python -m otpmesh.bench --help`` lists the others, and
``python -m otpmesh.bench SUITE --help`` gives a suite's own options. ``otpmesh bench`` runs the
core, rdma and hosts suites with each step announced as it runs.

This package imports nothing: a worker that hosts the benchmarks' actor
(``otpmesh.bench.actor.BenchActor``) imports only that module, as a user's worker would import
only its own code.
"""
