"""The benchmarks: scripts, each run as `python benchmarks/bench_NAME.py` (benchmarks/README.md).
A package too, so a test imports a benchmark's functions as `benchmarks.bench_NAME` (the
published runs they read are data: configs/runs/, loadax_mesh/published_runs.py)."""
