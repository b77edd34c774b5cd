"""The bf16 matmuls of a training step, timed on this machine's GPU: jax beside PyTorch.

For each model, every projection of a layer and the head at the step's token count, in the three
shapes a step runs them (forward: tokens x d_in @ d_in x d_out; the input gradient: tokens x
d_out @ d_out x d_in; the weight gradient: d_in x tokens @ tokens x d_out), jitted by jax and
run by torch.matmul on the same shapes in the same process (the peer: cuBLAS called directly).
Then one layer's attention at those tokens through cuDNN's fused kernels (jax's
`dot_product_attention`), forward and backward. Each time is the median of `--reps` runs after
warm-ups; the rate is FLOPs over time and its share of the catalogue's peak for this GPU kind:
what a matmul and an attention kernel reach on one chip, measured per shape
(benchmarks/RESULTS.md).

    python benchmarks/bench_gpu_matmul.py [--model llama3-8b --tokens 16384 ...] [--json FILE]
        [--small]   # tiny shapes on any backend: checks the script, measures nothing

Needs a GPU for numbers; with --small it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

# (model, tokens per matmul): the reference step's micro-batch on one device
DEFAULT = [("llama3-8b", 16384), ("llama2-7b", 16384), ("llama3-70b", 8192)]


def shapes(model_name: str, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of every matmul a layer and the head run in a step, once each."""
    from loadax_mesh.workload import ModelSpec

    m = ModelSpec.from_name(model_name)
    d, q = m.d_model, m.num_heads * m.head_dim
    kv = 2 * m.num_kv_heads * m.head_dim
    up = 2 * m.d_ff if m.mlp == "swiglu" else m.d_ff
    out = []
    for name, d_in, d_out in [
        ("q", d, q),
        ("kv", d, kv),
        ("o", q, d),
        ("mlp_up", d, up),
        ("mlp_down", m.d_ff, d),
        ("head", d, m.vocab_size),
    ]:
        out += [
            (f"{name} fwd", tokens, d_in, d_out),
            (f"{name} dx", tokens, d_out, d_in),
            (f"{name} dw", d_in, tokens, d_out),
        ]
    return out


def _median_seconds(run: Any, sync: Any, reps: int) -> float:
    for _ in range(3):
        run()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_jax(m: int, k: int, n: int, reps: int) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
    f = jax.jit(jnp.dot)  # bf16 in and out, as the step's einsums (the GEMM sums in float32)
    box: list[Any] = []
    return _median_seconds(
        lambda: box.append(f(a, b)), lambda: (box[-1].block_until_ready(), box.clear()), reps
    )


def time_attention(model_name: str, tokens: int, reps: int, small: bool) -> tuple[float, ...]:
    """(causal query-key pairs, forward seconds, forward + backward seconds) of one layer's
    attention at `tokens` (sequences of the model's length; cuDNN's kernels on a GPU)."""
    import jax
    import jax.numpy as jnp

    from loadax_mesh.workload import ModelSpec

    m = ModelSpec.from_name(model_name)
    seq = m.seq_len // 64 if small else m.seq_len
    rows, d = max(1, tokens // m.seq_len), m.head_dim
    kind = "cudnn" if jax.default_backend() == "gpu" else None
    q, k, v = (
        jax.random.normal(jax.random.key(i), (rows, seq, h, d), jnp.bfloat16)
        for i, h in enumerate((m.num_heads, m.num_kv_heads, m.num_kv_heads))
    )

    def attend(q: Any, k: Any, v: Any) -> Any:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=kind)

    forward = jax.jit(attend)
    both = jax.jit(jax.grad(lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum(), (0, 1, 2)))
    box: list[Any] = []

    def sync() -> None:
        jax.block_until_ready(box[-1])
        box.clear()

    fwd = _median_seconds(lambda: box.append(forward(q, k, v)), sync, reps)
    fwd_bwd = _median_seconds(lambda: box.append(both(q, k, v)), sync, reps)
    return rows * seq * (seq + 1) / 2, fwd, fwd_bwd


def time_torch(m: int, k: int, n: int, reps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    pair = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in ((m, k), (k, n))]
    seconds = _median_seconds(lambda: torch.matmul(*pair), torch.cuda.synchronize, reps)
    pair.clear()
    torch.cuda.empty_cache()  # torch keeps no shape's operands beside jax's pool
    return seconds


def peak_flops(device_kind: str) -> float | None:
    from loadax_mesh.hardware.catalogue import catalogue

    for t in catalogue().types:
        if t.platform == "gpu" and device_kind in t.device_kinds:
            from loadax_mesh.hardware.profile import hardware_profile

            facts = hardware_profile(f"gpu-{t.key}-{t.devices_per_host}").device
            return None if facts is None else facts.peak_flops
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="model name (repeatable)")
    ap.add_argument("--tokens", type=int, action="append", help="tokens, one per --model")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="tiny shapes, any backend")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    import jax

    from loadax_mesh.workload import ModelSpec

    if jax.default_backend() != "gpu" and not a.small:
        print(f"no GPU (jax's backend is {jax.default_backend()!r})")
        sys.exit(2)
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    cases = (
        list(zip(a.model, a.tokens or [16384] * len(a.model), strict=True)) if a.model else DEFAULT
    )
    print(f"device kind {kind!r}, catalogue peak {peak and peak / 1e12} TFLOP/s", flush=True)
    rows = []
    for model_name, tokens in cases:
        total_flops = jax_s = torch_s = 0.0
        for name, m, k, n in shapes(model_name, tokens):
            if a.small:
                m, k, n = max(1, m // 64), max(1, k // 64), max(1, n // 64)
            flops = 2.0 * m * k * n
            tj = time_jax(m, k, n, a.reps)
            tt = time_torch(m, k, n, a.reps)
            row = {"model": model_name, "tokens": tokens, "op": name, "m": m, "k": k, "n": n}
            row |= {"flops": flops, "jax_s": tj, "torch_s": tt, "device_kind": kind}
            rows.append(row)
            total_flops, jax_s = total_flops + flops, jax_s + tj
            torch_s += tt or 0.0
            share = f" ({flops / tj / peak:.2f} of peak)" if peak else ""
            peer = f"; torch {flops / tt / 1e12:.0f} (jax/torch time {tj / tt:.2f})" if tt else ""
            print(
                f"{model_name:11s} {name:12s} {m:6d}x{k:6d}x{n:6d}: jax "
                f"{flops / tj / 1e12:6.0f} TFLOP/s{share}{peer}",
                flush=True,
            )
        share = f" ({total_flops / jax_s / peak:.3f} of peak)" if peak else ""
        peer = f", torch {total_flops / torch_s / 1e12:.0f}" if torch_s else ""
        print(f"{model_name}: all shapes jax {total_flops / jax_s / 1e12:.0f}{share}{peer}")
        # the attention kernels: 4 FLOPs a causal pair, head and head_dim forward, 10 backward
        # (cost/timing/step.py's cuDNN count)
        pairs, fwd, fwd_bwd = time_attention(model_name, tokens, a.reps, a.small)
        spec = ModelSpec.from_name(model_name)
        unit = pairs * spec.num_heads * spec.head_dim
        rows.append(
            {"model": model_name, "tokens": tokens, "op": "attention", "pairs": pairs,
             "forward_s": fwd, "forward_backward_s": fwd_bwd, "device_kind": kind}
        )  # fmt: skip
        rates = [4 * unit / fwd, 10 * unit / max(fwd_bwd - fwd, 1e-12)]
        print(
            f"{model_name}: attention forward {fwd * 1e3:.2f} ms, backward "
            f"{(fwd_bwd - fwd) * 1e3:.2f} ms: "
            + ", ".join(f"{r / 1e12:.0f} TFLOP/s" + (f" ({r / peak:.2f})" if peak else "")
                        for r in rates),
            flush=True,
        )  # fmt: skip
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
