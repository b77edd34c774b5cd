"""`shard_batch` against the raw `jax.make_array_from_process_local_data` call, same arrays.

Both make a global batch sharded on dimension 0 over the `data` axis of a mesh of 8 CPU
devices, from host arrays of 1 MiB to 256 MiB. Calls run in rounds of raw, ours, ours, raw so
both see the same machine state; times are medians of calls including `block_until_ready`.
The ratio (the median over rounds of raw time / our time) is our throughput over raw's
(target >= 0.95: validation and the cached layout lookup cost next to nothing). A second
layout, (4, 2) `data`/`model`, copies every row to two devices.

    python benchmarks/bench_batch.py [--sizes 1 4 16 64 256] [--min-time 2.0] [--min-rounds 9]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import loadax_mesh as lm

TARGET = 0.95
MIB = 1 << 20
FEATURES = 1024  # float32 columns: one row is 4 KiB


def _one(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    out = fn()
    out.block_until_ready()
    elapsed = time.perf_counter() - start
    del out
    return elapsed


def _measure(
    raw: Callable[[], Any], ours: Callable[[], Any], *, min_time: float, min_rounds: int
) -> tuple[float, float, float, int]:
    """Median times of raw and ours, and the median of per-round ratios raw / ours.

    A round runs raw, ours, ours, raw (ABBA), so drift and the cost of freeing the previous
    output fall on both sides alike.
    """
    for fn in (raw, ours):  # warm up: caches, allocator, first-call work
        _one(fn)
    raw_times: list[float] = []
    our_times: list[float] = []
    ratios: list[float] = []
    spent = 0.0
    while len(ratios) < min_rounds or spent < min_time:
        a1, b1, b2, a2 = _one(raw), _one(ours), _one(ours), _one(raw)
        raw_times += [a1, a2]
        our_times += [b1, b2]
        ratios.append((a1 + a2) / (b1 + b2))
        spent += a1 + a2 + b1 + b2
    return (
        statistics.median(raw_times),
        statistics.median(our_times),
        statistics.median(ratios),
        len(ratios),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256], help="host array sizes in MiB"
    )
    parser.add_argument(
        "--min-time", type=float, default=2.0, help="seconds of calls per size and layout"
    )
    parser.add_argument(
        "--min-rounds",
        type=int,
        default=9,
        help="rounds (raw, ours, ours, raw) per size and layout, at least",
    )
    args = parser.parse_args()
    assert jax.device_count() == 8, jax.devices()
    print(f"jax {jax.__version__}, {jax.device_count()} CPU devices, {os.cpu_count()} cores")
    print()
    print(
        "| layout | MiB | raw GB/s | shard_batch GB/s | raw ms | shard_batch ms | ratio | rounds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = float("inf")
    layouts = [((8,), ("data",)), ((4, 2), ("data", "model"))]
    for shape, names in layouts:
        mesh = lm.MeshConfig(shape, names).create_device_mesh()
        sharding = NamedSharding(mesh, PartitionSpec("data"))
        for mib in args.sizes:
            rows = mib * MIB // (FEATURES * 4)
            x = np.random.default_rng(mib).standard_normal((rows, FEATURES), dtype=np.float32)
            raw_out = jax.make_array_from_process_local_data(sharding, x)
            our_out = lm.shard_batch(x, mesh)
            assert our_out.sharding == raw_out.sharding and our_out.shape == raw_out.shape
            np.testing.assert_array_equal(np.asarray(our_out), np.asarray(raw_out))
            del raw_out, our_out
            raw_t, our_t, ratio, rounds = _measure(
                lambda x=x, s=sharding: jax.make_array_from_process_local_data(s, x),
                lambda x=x, m=mesh: lm.shard_batch(x, m),
                min_time=args.min_time,
                min_rounds=args.min_rounds,
            )
            worst = min(worst, ratio)
            label = "x".join(map(str, shape))
            print(
                f"| {label} | {mib} | {x.nbytes / raw_t / 1e9:.2f} | "
                f"{x.nbytes / our_t / 1e9:.2f} | {raw_t * 1e3:.3f} | {our_t * 1e3:.3f} | "
                f"{ratio:.3f} | {rounds} |",
                flush=True,
            )
    print()
    verdict = "meets" if worst >= TARGET else "misses"
    print(f"lowest ratio {worst:.3f}: {verdict} the target {TARGET}")


if __name__ == "__main__":
    main()
