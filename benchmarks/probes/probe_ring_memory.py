"""Ring attention's backward: its custom VJP against autodiff through the hops, compiled memory.

One attention layer's forward and backward (the gradients of q, k, v of a weighted sum of the
output) under `jax.shard_map` over a `seq` axis of c devices, at a model's attention shapes
(bfloat16): `custom_vjp` is `ring_attention` as the step runs it; `autodiff` differentiates the
same forward hops (`ring._forward`) with jax's own transpose, which keeps every live tile's
probabilities for the backward. Prints the compiler's memory_analysis per device (arguments,
temp), the FLOPs it counts (every loop trip, each conditional as its costliest branch: every
tile computed, an upper bound of the ring's work), and the collective-permutes of the HLO.
Results: docs/notes/2026-12-02-ring-attention.md.

    python benchmarks/probes/probe_ring_memory.py [--hardware tpu-v5p-8] [--seq 8192]
        [--shards 4] [--heads 32] [--kv-heads 8] [--head-dim 128] [--tile 1024] [--unbalanced]
"""

from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from loadax_mesh.compiler.flops import step_flops
from loadax_mesh.compiler.hlo import HloText
from loadax_mesh.workload import ring


def compiled(args: argparse.Namespace, how: str) -> jax.stages.Compiled:
    if args.hardware == "cpu":
        devices = jax.devices()[: args.shards]
    else:
        from loadax_mesh import topology_devices

        devices = topology_devices(args.hardware)[: args.shards]
    mesh = Mesh(np.array(devices), ("seq",))
    s, c = args.seq, args.shards
    positions = ring.shard_positions(s, c, balanced=not args.unbalanced).reshape(-1)
    spec = P(None, "seq")

    def attend(q, k, v, pos):
        if how == "custom_vjp":
            return ring.ring_attention(
                q, k, v, axis_name="seq", q_pos=pos, kv_pos=pos, window=args.window, tile=args.tile
            )
        t = ring._tile(q.shape[1], args.tile)  # the same hops, jax's transpose
        return ring._forward(q, k, v, pos, pos, "seq", args.window, t)[0]

    run = jax.shard_map(attend, mesh=mesh, in_specs=(spec,) * 3 + (P("seq"),), out_specs=spec)

    def loss(q, k, v, w, pos):
        return (run(q, k, v, pos).astype(jnp.float32) * w).sum()

    def shaped(*shape, dtype=jnp.bfloat16, where=spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, where))

    b, h, kvh, d = args.batch, args.heads, args.kv_heads, args.head_dim
    inputs = (shaped(b, s, h, d), shaped(b, s, kvh, d), shaped(b, s, kvh, d))
    inputs += (shaped(b, s, h, d, dtype=jnp.float32),)
    pos = jax.device_put(positions, NamedSharding(mesh, P("seq"))) if args.hardware == "cpu" else (
        shaped(s, dtype=jnp.int32, where=P("seq"))
    )  # fmt: skip
    return jax.jit(jax.grad(loss, (0, 1, 2))).lower(*inputs, pos).compile()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="cpu", help="cpu, or a TPU topology string")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tile", type=int, default=ring.TILE)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--unbalanced", action="store_true")
    args = parser.parse_args()
    print(f"{args.hardware}: seq {args.seq} over {args.shards}, batch {args.batch}, heads "
          f"{args.heads}/{args.kv_heads} x {args.head_dim}, tile {args.tile}, window "
          f"{args.window}, {'contiguous' if args.unbalanced else 'balanced'}")  # fmt: skip
    for how in ("custom_vjp", "autodiff"):
        try:
            c = compiled(args, how)
        except jax.errors.JaxRuntimeError as error:  # libtpu refuses what does not fit
            print(f"{how:>10}: {str(error).splitlines()[0][:200]}")
            continue
        mem = c.memory_analysis()
        text = c.as_text()
        flops = step_flops(c, HloText(text)) or float("nan")
        permutes = len(re.findall(r" collective-permute(?:-start)?\(", text))
        print(f"{how:>10}: arguments {mem.argument_size_in_bytes / 2**20:9.1f} MiB, temp "
              f"{mem.temp_size_in_bytes / 2**20:9.1f} MiB, output "
              f"{mem.output_size_in_bytes / 2**20:8.1f} MiB, FLOPs {flops:.3g}, "
              f"collective-permutes in the HLO {permutes}")  # fmt: skip


if __name__ == "__main__":
    main()
