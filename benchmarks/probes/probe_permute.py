"""What the TPU compiler makes of the dropless MoE path's row permutes, one op at a time.

For each dropless run of configs/runs/moe.toml (M8-M11), at one device's shapes of one MoE
layer (its t tokens, t * k copies, d_model columns, bfloat16), compiles alone on one
compile-only TPU device:

- `take`: the copies gathered into expert order, `jnp.take(x, idx, axis=0)` with duplicate
  indices (each token k times: MaxText at 9ca35d7) or a permutation of the t * k copies (the
  unsort, and the sort after `jnp.repeat` at 3eb77db);
- `take^T`: its transpose as jax emits it (the backward pass without a custom VJP): a
  scatter-add by row index;
- `argsort`: of t * k int32 (the sort, and the unsort's indices);
- `custom vjp`: MaxText's `_sort_activations_custom` backward (3eb77db,
  `use_custom_sort_vjp=True`): argsort of the permutation, then a gather by it;
- `repeat^T` (k > 1): the transpose of 3eb77db's `jnp.repeat`, the k copies' sum.

Prints per op XLA's `optimal_seconds`, its `bytes accessed` over the rows' bytes moved, those
bytes over the optimal seconds (an effective bandwidth) as a share of the chip's HBM
bandwidth, and the optimised HLO's ops that do the work (scatter, gather, sort, while). One
TPU compile at a time; about a minute for the four runs. Results:
docs/notes/2026-11-26-dropless-permutes.md.

    python benchmarks/probes/probe_permute.py [--hardware tpu-v5p-8] [--runs M9,M11]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the bench modules

from bench_moe_time import load

from loadax_mesh import topology_devices
from loadax_mesh.cost.parts.moe import MoeShapes
from loadax_mesh.hardware.strings import parse_hardware
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload.layout import Roles

WORK = ("scatter", "gather", "sort", "while")


def shapes(spec: dict[str, Any]) -> tuple[str, int, int, int]:
    """(name, t, k, d_model) of one device's MoE layer under the run's mesh and batch."""
    run = load(spec)
    model, train, plan = run.parts[0], run.parts[1], run.parts[2:]
    roles = next(p for p in plan if isinstance(p, Roles))
    ms = MoeShapes.of(model, train, roles)
    return spec["name"].split()[0], ms.tokens, model.experts_per_token, model.d_model


def ops(t: int, k: int, d: int) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (function, abstract args)."""
    import jax
    import jax.numpy as jnp

    n = t * k
    rows_t = jax.ShapeDtypeStruct((t, d), jnp.bfloat16)
    rows_n = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
    idx = jax.ShapeDtypeStruct((n,), jnp.int32)

    def take(x: Any, i: Any) -> Any:
        return jnp.take(x, i, axis=0)

    def transpose(src: Any) -> Any:
        def f(g: Any, i: Any) -> Any:
            _, vjp = jax.vjp(lambda x: take(x, i), jnp.zeros(src.shape, src.dtype))
            return vjp(g)[0]

        return f

    def custom_bwd(g: Any, perm: Any) -> Any:
        return jnp.take(g, jnp.argsort(perm), axis=0)

    found = {
        "take dup [t]->[tk]": (take, [rows_t, idx]),
        "take^T dup [tk]->[t]": (transpose(rows_t), [rows_n, idx]),
        "take perm [tk]->[tk]": (take, [rows_n, idx]),
        "take^T perm [tk]->[tk]": (transpose(rows_n), [rows_n, idx]),
        "argsort [tk] int32": (jnp.argsort, [idx]),
        "custom vjp bwd (argsort+take)": (custom_bwd, [rows_n, idx]),
        "repeat^T [tk]->[t] (sum of k)": (
            lambda g: g.reshape(t, k, d).sum(axis=1, dtype=jnp.float32).astype(jnp.bfloat16),
            [rows_n],
        ),
    }
    if k == 1:
        found = {n: v for n, v in found.items() if "dup" not in n and "repeat" not in n}
    return found


def compile_one(fn: Any, args: list[Any], device: Any) -> tuple[dict[str, float], Counter]:
    import jax
    from jax.sharding import SingleDeviceSharding

    s = SingleDeviceSharding(device)
    compiled = jax.jit(fn, in_shardings=tuple(s for _ in args)).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    text = compiled.as_text()
    kinds: Counter = Counter()
    for line in text.splitlines():
        kinds.update(op for op in WORK if re.search(rf"\) {op}\(|\}} {op}\(", line))
    return {k: float(v) for k, v in cost.items()}, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="tpu-v5p-8")
    parser.add_argument("--runs", default="M8,M9,M10,M11")
    args = parser.parse_args()
    wanted = args.runs.split(",")
    fact = parse_hardware(args.hardware).type.fact("hbm_bandwidth")
    hbm = fact.base if fact is not None and fact.base else float("nan")
    device = next(iter(topology_devices(args.hardware)))
    print(f"{args.hardware}: HBM {hbm / 1e12:.2f} TB/s; device {device}")
    for spec in published_runs("moe")["runs"]:
        if spec["name"].split()[0] not in wanted:
            continue
        name, t, k, d = shapes(spec)
        row = d * 2
        print(f"\n{name}: t {t}, k {k}, d_model {d}; t*k rows {t * k * row / 1e9:.3f} GB")
        for label, (fn, fargs) in ops(t, k, d).items():
            cost, kinds = compile_one(fn, fargs, device)
            sec = cost.get("optimal_seconds", float("nan"))
            moved = t * k * (4 if label.startswith("argsort") else row)
            rate = moved / sec if sec > 0 else float("nan")
            print(
                f"  {label:30s} optimal {sec * 1e3:8.3f} ms  accessed/moved "
                f"{cost.get('bytes accessed', 0) / moved:5.1f}  rows/optimal {rate / 1e9:7.1f} "
                f"GB/s = {rate / hbm:.4f} of HBM  {dict(sorted(kinds.items()))}"
            )


if __name__ == "__main__":
    main()
