"""The step's loss: next-token cross-entropy over the unembedding, whole or in chunks.

`logits_chunks` > 1 (TrainSpec) runs the unembedding matmul and the cross-entropy in a scan
over that many slices of each device's tokens, each slice under `jax.checkpoint`: the forward
keeps only one slice's `[tokens, vocab]` logits and the backward recomputes each slice's
logits from the final hidden states, so the whole logits never exist (as MaxText's
`num_vocab_tiling` and fused cross-entropy kernels do).

Inside a manual `shard_map` the vocabulary may be cut over a mesh axis (`VocabSplit`: the
1F1B head, pipeline_1f1b.py): each device holds its columns of the logits, and the
cross-entropy takes the maxima, the sums and the target's logit over the axis; its backward
needs no collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding


@dataclass(frozen=True)
class VocabSplit:
    """This device's columns of the logits: from `offset` (a traced index) of a `vocab`-wide
    table cut over the manual mesh axis `axis` (columns from `vocab` on are padding)."""

    axis: str
    offset: jax.Array
    vocab: int


def cross_entropy_loss(
    x: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    *,
    chunks: int,
    logits_sharding: NamedSharding,
    chunk_sharding: tuple[NamedSharding, NamedSharding],
    split: VocabSplit | None = None,
) -> jax.Array:
    """Mean cross-entropy (float32) of `x` [batch, seq, d] @ `unembed` [d, vocab] against
    `targets` [batch, seq]. With `chunks` > 1 the sequence is cut into `chunks` interleaved
    slices (position i goes to slice i % chunks), so each device's contiguous block of the
    sequence splits locally, with no communication; `chunk_sharding` gives the shardings of
    the chunked hidden states [chunks, batch, seq/chunks, d] and targets. With `split`,
    `unembed` is this device's columns [d, vocab / axis size]."""
    ce: Any = cross_entropy if split is None else partial(split_cross_entropy, split=split)
    if chunks == 1:
        logits = jnp.einsum("bsd,dv->bsv", x, unembed)
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
        return jnp.mean(ce(logits, targets))
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
        return total + jnp.sum(ce(logits, tc)), None

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


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _split(logits: jax.Array, targets: jax.Array, offset: jax.Array, axis: str, vocab: int) -> Any:
    return _split_fwd(logits, targets, offset, axis, vocab)[0]


def split_cross_entropy(logits: jax.Array, targets: jax.Array, *, split: VocabSplit) -> jax.Array:
    """`cross_entropy` of this device's columns of the logits (`split`): every device gets
    every token's loss."""
    return _split(logits, targets, split.offset, split.axis, split.vocab)


def _split_fwd(
    logits: jax.Array, targets: jax.Array, offset: jax.Array, axis: str, vocab: int
) -> tuple[jax.Array, Any]:
    width = logits.shape[-1]
    real = offset + jnp.arange(width) < vocab
    # arithmetic, not jnp.where: inside a stage the logits' sharding names the outer mesh
    wide = logits.astype(jnp.float32) + jnp.where(real, 0.0, -jnp.inf)
    top = jax.lax.pmax(jnp.max(wide, axis=-1), axis)
    total = jax.lax.psum(jnp.sum(jnp.exp(wide - top[..., None]), axis=-1), axis)
    lse = top + jnp.log(total)
    local = targets - offset
    mine = (local >= 0) & (local < width)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, width - 1)[..., None], axis=-1)
    target = jax.lax.psum(picked[..., 0].astype(jnp.float32) * mine, axis)
    return lse - target, (logits, lse, local, real)


def _split_bwd(axis: str, vocab: int, res: Any, g: jax.Array) -> tuple[jax.Array, None, None]:
    logits, lse, local, real = res
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None]) * real
    hot = jax.nn.one_hot(local, logits.shape[-1], dtype=jnp.float32)  # none where not mine
    return ((probs - hot) * g[..., None]).astype(logits.dtype), None, None


_split.defvjp(_split_fwd, _split_bwd)
