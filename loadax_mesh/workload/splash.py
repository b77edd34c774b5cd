"""TPU attention: jax's splash-attention Pallas kernel under `shard_map` (heads over the tensor
axis, query blocks over the sequence axis, keys and values gathered along the sequence).

The kernel's mask is lazy (computed per block, blocks it rules out skipped): causal, or local
(`window` > 0: each query sees itself and the `window` - 1 keys before it, splash's
`LocalMask`). Under the load-balanced sequence order (context.py) the mask's query positions
are the permuted ones (`q_sequence`, as MaxText's LoadBalancedCausalMask sets them) and the
gathered keys and values are put back into contiguous order on each device before the
kernel, whose key positions are contiguous (MaxText's reorder to contiguous after the
all-gather): a local copy, no communication.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .kernels import gathered, shard_map_mesh
from .layout import Roles, splash_blocks


def splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mesh: Mesh,
    r: Roles,
    *,
    window: int,
    positions: np.ndarray | None,
) -> jax.Array:
    """Splash attention of q [batch, seq, heads, head_dim] over k, v; `positions`: each token
    slot's position in the step's order (None: contiguous)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernels,
    )

    _, s, h, d = q.shape
    q_block, kv_block = splash_blocks(s, r)
    sizes = kernels.BlockSizes(
        block_q=q_block,
        block_kv=kv_block,
        block_kv_compute=kv_block,
        block_q_dkv=q_block,
        block_kv_dkv=kv_block,
        block_kv_dkv_compute=kv_block,
        block_q_dq=q_block,
        block_kv_dq=kv_block,
    )
    kernel = kernels.make_splash_mha(
        _mask(s, h, window, positions),
        block_sizes=sizes,
        head_shards=r.size("model"),
        q_seq_shards=r.size("seq"),
    )
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(mesh, P(r.model, r.seq)))
    batch = r.mesh_axes(("batch",))[0]
    q_spec = P(batch, r.model, r.seq, None)
    back = None if positions is None else _contiguous_chunks(positions)
    seq = r.seq if r.size("seq") > 1 else None

    def local(kernel: kernels.SplashAttentionKernel, q: jax.Array, k: jax.Array, v: jax.Array):
        k, v = gathered(k, seq, 2), gathered(v, seq, 2)
        if back is not None:
            k, v = _reorder(k, back), _reorder(v, back)
        return jax.vmap(kernel)(q, k, v)

    sharded = jax.shard_map(
        local,
        **shard_map_mesh(mesh),  # inside a pipeline stage too
        in_specs=(kernel_spec, q_spec, q_spec, q_spec),
        out_specs=q_spec,
        check_vma=False,
    )
    heads_first = (0, 2, 1, 3)  # [batch, heads, seq, head_dim], as the kernel takes them
    out = sharded(
        kernel,
        (q * d**-0.5).transpose(heads_first),
        k.transpose(heads_first),
        v.transpose(heads_first),
    )
    return out.transpose(heads_first)


def _mask(s: int, h: int, window: int, positions: np.ndarray | None) -> Any:
    """The kernel's lazy mask for every head: causal or local, its query rows at `positions`."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    one: masks._ComputableMask = (
        masks.LocalMask((s, s), window_size=(window - 1, 0), offset=0)
        if window
        else masks.CausalMask((s, s))
    )
    if positions is not None:
        one.q_sequence = np.asarray(positions, dtype=np.int32)
    return masks.MultiHeadMask([one for _ in range(h)])


def _contiguous_chunks(positions: np.ndarray) -> list[tuple[int, int]]:
    """The slices of the step's token order that, concatenated, give positions 0, 1, ...:
    the chunks of the permuted order (runs of consecutive positions), sorted by position."""
    starts = [0, *(int(i) for i in np.flatnonzero(np.diff(positions) != 1) + 1)]
    chunks = [(a, b) for a, b in zip(starts, [*starts[1:], len(positions)], strict=True)]
    return sorted(chunks, key=lambda c: int(positions[c[0]]))


def _reorder(a: jax.Array, chunks: list[tuple[int, int]]) -> jax.Array:
    """`a` [batch, heads, seq, head_dim] with its sequence's chunks in the given order."""
    return jnp.concatenate([a[:, :, lo:hi] for lo, hi in chunks], axis=2)
