"""Grouped matmuls (the dropless MoE experts) on this machine's GPU: tokamax's kernel, the one
the reference step runs, against its peers on the same input in the same run.

For each catalogue MoE model's expert shapes (rows M routed to G experts evenly, [M, K] x
[G, K, N]): the forward pass alone and forward plus both gradients (rows and weights), by
- `ideal`: a batched einsum over rows already split by expert, equal groups (the bound: what
  cuBLAS reaches when every expert's rows sit in one block of equal size),
- `tokamax`: `tokamax.ragged_dot(..., implementation="mosaic")` (workload/kernels.py),
- `jax_mgpu`: jax's own Pallas kernel `ragged_dot_mgpu` (forward only; untuned blocks),
- `xla`: `jax.lax.ragged_dot`, which XLA's GPU compiler makes a dense dot over every expert.
Each: the median of 5 calls after one warm-up, TFLOP/s over the routed work (2 M K N a pass),
its share of the chip's dense bf16 peak (989 TFLOP/s on an H100 or H200) and the compiled
temp memory. The shares are what configs/hardware.toml's `grouped_matmul_share` rests on.

    python benchmarks/bench_gpu_grouped.py [--rows 65536] [--json FILE]

Needs a GPU with tokamax (`pip install 'loadax-mesh[gpu]'`); prints "no GPU" and exits 2
without one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from typing import Any

PEAK = 989e12  # dense bf16 FLOP/s of an H100 / H200 SXM (configs/hardware.toml)
# (name, K, N, G): the experts' input projection (d_model -> moe_d_ff) and output projection
SHAPES = [
    ("mixtral-8x7b up", 4096, 14336, 8),
    ("mixtral-8x7b down", 14336, 4096, 8),
    ("qwen3-235b up", 4096, 1536, 128),
    ("qwen3-235b down", 1536, 4096, 128),
    ("deepseek-v3 up", 7168, 2048, 256),
    ("deepseek-v3 down", 2048, 7168, 256),
]


def timed(fn: Any, *args: Any, reps: int = 5) -> tuple[float, float | None]:
    """(median seconds of `reps` calls after a warm-up, compiled temp bytes)."""
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    temp = getattr(compiled.memory_analysis(), "temp_size_in_bytes", None)
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), temp


def candidates(g: int) -> dict[str, Any]:
    """name -> f(lhs, rhs, sizes) for every way measured here."""
    import jax
    import jax.numpy as jnp

    def ideal(lhs: Any, rhs: Any, sizes: Any) -> Any:
        m, k = lhs.shape
        return jnp.einsum("gmk,gkn->gmn", lhs.reshape(g, m // g, k), rhs).reshape(m, -1)

    found: dict[str, Any] = {"ideal": ideal}
    try:
        import tokamax

        found["tokamax"] = partial(tokamax.ragged_dot, implementation="mosaic")
    except ImportError as err:
        print(f"tokamax: not importable ({err})", flush=True)
    try:
        from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

        mgpu = partial(
            ragged_dot_mgpu.ragged_dot,
            block_m=128,
            block_n=128,
            block_k=64,
            max_concurrent_steps=4,
            grid_block_n=1,
        )
        found["jax_mgpu"] = lambda lhs, rhs, sizes: mgpu(lhs, rhs, group_sizes=sizes)
    except ImportError as err:
        print(f"jax's ragged_dot_mgpu: not importable ({err})", flush=True)
    found["xla"] = jax.lax.ragged_dot
    return found


def sweep(rows: int) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    out = []
    for name, k, n, g in SHAPES:
        k1, k2 = jax.random.split(jax.random.key(0))
        lhs = jax.random.normal(k1, (rows, k), jnp.bfloat16)
        rhs = jax.random.normal(k2, (g, k, n), jnp.bfloat16) * 0.02
        sizes = jnp.full((g,), rows // g, jnp.int32)
        flops = 2.0 * rows * k * n
        row: dict[str, Any] = {"case": name, "M": rows, "K": k, "N": n, "G": g}
        for label, fn in candidates(g).items():
            passes = [("fwd", fn, 1)]
            if label in ("ideal", "tokamax", "xla"):

                def loss(lhs: Any, rhs: Any, sizes: Any, fn: Any = fn) -> Any:
                    return jnp.sum(fn(lhs, rhs, sizes).astype(jnp.float32) ** 2)

                passes.append(("fwd+bwd", jax.grad(loss, argnums=(0, 1)), 3))
            for kind, f, times in passes:
                if label == "xla" and g > 8:  # dense over every expert: G times the work
                    row[f"{label} {kind}"] = {"skipped": f"dense over {g} experts"}
                    continue
                try:
                    seconds, temp = timed(f, lhs, rhs, sizes)
                    rate = times * flops / seconds
                    row[f"{label} {kind}"] = {
                        "ms": round(seconds * 1e3, 3),
                        "tflops": round(rate / 1e12, 1),
                        "share": round(rate / PEAK, 3),
                        "temp_gb": None if temp is None else round(temp / 1e9, 2),
                    }
                except Exception as err:  # a kernel that refuses this shape: say so, go on
                    row[f"{label} {kind}"] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536, help="routed rows M (token copies)")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    import jax

    if jax.default_backend() != "gpu":
        print(f"no GPU (jax's backend is {jax.default_backend()!r})")
        sys.exit(2)
    print(f"devices: {jax.devices()}; jax {jax.__version__}", flush=True)
    rows = sweep(a.rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\nshare of peak (fwd | fwd+bwd); tokamax / ideal")
    for r in rows:
        cells = []
        for label in ("ideal", "tokamax", "jax_mgpu", "xla"):
            f, b = r.get(f"{label} fwd", {}), r.get(f"{label} fwd+bwd", {})
            cells.append(f"{label} {f.get('share', '-')} | {b.get('share', '-')}")
        tk, ideal = r.get("tokamax fwd+bwd", {}), r.get("ideal fwd+bwd", {})
        ratio = tk["share"] / ideal["share"] if "share" in tk and "share" in ideal else None
        print(f"{r['case']:18s} " + "; ".join(cells) + f"; ratio {ratio}")


if __name__ == "__main__":
    main()
