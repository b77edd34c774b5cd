"""The step's loss: next-token cross-entropy over the unembedding, whole or in chunks.

`logits_chunks` > 1 (TrainSpec) runs the unembedding matmul and the cross-entropy in a scan
over that many slices of each device's tokens, each slice under `jax.checkpoint`: the forward
keeps only one slice's `[tokens, vocab]` logits and the backward recomputes each slice's
logits from the final hidden states, so the whole logits never exist (as MaxText's
`num_vocab_tiling` and fused cross-entropy kernels do).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding


def cross_entropy_loss(
    x: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    *,
    chunks: int,
    logits_sharding: NamedSharding,
    chunk_sharding: tuple[NamedSharding, NamedSharding],
) -> jax.Array:
    """Mean cross-entropy (float32) of `x` [batch, seq, d] @ `unembed` [d, vocab] against
    `targets` [batch, seq]. With `chunks` > 1 the sequence is cut into `chunks` interleaved
    slices (position i goes to slice i % chunks), so each device's contiguous block of the
    sequence splits locally, with no communication; `chunk_sharding` gives the shardings of
    the chunked hidden states [chunks, batch, seq/chunks, d] and targets."""
    if chunks == 1:
        logits = jnp.einsum("bsd,dv->bsv", x, unembed)
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
        return jnp.mean(cross_entropy(logits, targets))
    b, s, d = x.shape
    xs = jnp.moveaxis(x.reshape(b, s // chunks, chunks, d), 2, 0)
    ts = jnp.moveaxis(targets.reshape(b, s // chunks, chunks), 2, 0)
    xs = jax.lax.with_sharding_constraint(xs, chunk_sharding[0])
    ts = jax.lax.with_sharding_constraint(ts, chunk_sharding[1])

    @jax.checkpoint
    def chunk(total: jax.Array, xt: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        xc, tc = xt
        logits = jnp.einsum("bsd,dv->bsv", xc, unembed)
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
        return total + jnp.sum(cross_entropy(logits, tc)), None

    total, _ = jax.lax.scan(chunk, jnp.zeros((), jnp.float32), (xs, ts))
    return total / (b * s)


@jax.custom_vjp
def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token cross-entropy in float32 over logits kept in the compute dtype: the backward
    pass recomputes the softmax from them instead of saving a float32 copy (as fused
    cross-entropy kernels do), so the logits cost their compute dtype once, not twice."""
    return _cross_entropy_fwd(logits, targets)[0]


def _cross_entropy_fwd(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, Any]:
    # Each reduction widens the logits itself, so no float32 copy of them is kept.
    top = jnp.max(logits, axis=-1).astype(jnp.float32)
    total = jnp.sum(jnp.exp(logits.astype(jnp.float32) - top[..., None]), axis=-1)
    lse = top + jnp.log(total)
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return lse - target.astype(jnp.float32), (logits, lse, targets)


def _cross_entropy_bwd(res: Any, g: jax.Array) -> tuple[jax.Array, None]:
    logits, lse, targets = res
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)
    return ((probs - hot) * g[..., None]).astype(logits.dtype), None


cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)
