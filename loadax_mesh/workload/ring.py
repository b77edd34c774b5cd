"""Ring attention over the sequence axis (`TrainSpec.context_strategy="ring"`).

`ring_attention` runs inside a `jax.shard_map` manual over `axis_name` (c devices), each device
holding a slice of q, k, v and the absolute positions of its tokens. The key/value blocks go
round the ring by `lax.ppermute` to rank + 1 in c - 1 hops; the send of the next block is issued
before the attention of the block in hand and does not depend on it, so the collective-permute
can overlap that hop's compute (frontier.md 1.1, 1.5). Every mask comes from the positions
(causal: q_pos >= kv_pos; a window w also q_pos - kv_pos < w), so any token order is right:
contiguous shards or the dual-chunk-swap order of the load balance.

A hop's block is computed in tiles with a float32 online-softmax merge (m, l, o). A tile, and a
whole hop, that the mask excludes is skipped by `lax.cond` on the bounds of the tiles'
positions: exact where a tile's positions are consecutive (both orders, the tile dividing a
chunk), conservative otherwise (a tile is never skipped wrongly). Causal and unbalanced, the
blocks of later shards cost nothing; balanced, every hop after the first does half a block
(PyTorch's head-tail, frontier.md 1.3).

The backward is a `custom_vjp` (flash attention's): its residuals are q, k, v, the output and
each row's log-sum-exp. The blocks go round again, their float32 dK/dV accumulators one hop
behind (each accumulator's send overlaps the next hop's compute) and a last send brings each
block's gradients home: c - 1 sends of K/V and c of dK/dV, MaxText's ring. Autodiff through the
hops would keep every tile's probabilities: docs/notes/2026-12-02-ring-attention.md measures both.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import MeshConfigError

TILE = 1024  # the largest tile side: a tile's float32 scores are batch x heads x 1024^2 x 4 bytes
_NEG = -1e30  # the running maximum before any key: finite, so exp(m_old - m_new) stays defined
_F32 = jnp.float32
Tree = Any


def ring_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    axis_name: str,
    q_pos: jax.Array,
    kv_pos: jax.Array,
    window: int = 0,
    tile: int = TILE,
) -> jax.Array:
    """Causal (window 0) or local causal (a token and the `window` - 1 before it) grouped-query
    attention of the local q [batch, s, heads, d] over every shard's k, v [batch, s, kv_heads,
    d] (v's d may be narrower); q_pos, kv_pos int [s] are the absolute positions of this
    shard's tokens. Tiles are the largest divisor of s (of s / 2 where s is even) up to
    `tile`. Returns q's shape with v's head dim, in q's dtype."""
    b, s, h, _ = q.shape
    fields = {
        "k": (k.ndim == 4 and k.shape[:2] == (b, s) and h % k.shape[2] == 0, k.shape),
        "v": (v.shape[:3] == k.shape[:3], v.shape),
        "q_pos": (q_pos.shape == (s,), q_pos.shape),
        "kv_pos": (kv_pos.shape == (s,), kv_pos.shape),
    }
    for name, (ok, shape) in fields.items():
        if not ok:
            raise MeshConfigError(
                f"ring_attention: {name} has shape {shape}; accepted: q's batch and sequence "
                f"{(b, s)}, kv heads dividing {h}, v as k up to its head dim, positions [{s}]"
            )
    if window < 0 or tile < 1:
        raise MeshConfigError(
            f"ring_attention: window={window}, tile={tile}; accepted: window >= 0, tile >= 1"
        )
    return _ring(q, k, v, q_pos, kv_pos, axis_name, window, _tile(s, tile))


def _tile(s: int, largest: int) -> int:
    whole = s // 2 if s % 2 == 0 and s > 1 else s
    return max(t for t in range(1, min(largest, whole) + 1) if whole % t == 0)


def shard_positions(seq_len: int, shards: int, *, balanced: bool) -> np.ndarray:
    """[shards, seq_len / shards] int32: the positions each shard of the sequence axis holds;
    `balanced`: the sequence in 2 x shards chunks, shard i holding chunks i and 2 shards - 1 - i
    (MaxText's dual-chunk-swap); else contiguous."""
    parts = 2 * shards if balanced else shards
    if seq_len % parts:
        raise MeshConfigError(
            f"seq_len={seq_len} does not split into {parts} chunks of the seq axis (degree "
            f"{shards}{', load-balanced' if balanced else ''}); accepted: a multiple of {parts}"
        )
    chunks = np.arange(seq_len, dtype=np.int32).reshape(parts, -1)
    if not balanced:
        return chunks
    return np.concatenate([chunks[:shards], chunks[shards:][::-1]], axis=1)


# Tiled layouts: q [n, b, t, kvh, g, d]; k, v [n, b, t, kvh, d]; per-row stats (m, l, lse,
# delta) [n, b, kvh, g, t]; o, dq [n, b, kvh, g, t, d]; positions [n, t].


def _q_tiles(x: jax.Array, kv_heads: int, t: int) -> jax.Array:
    b, s, h, d = x.shape
    return x.reshape(b, s // t, t, kv_heads, h // kv_heads, d).transpose(1, 0, 2, 3, 4, 5)


def _kv_tiles(x: jax.Array, t: int) -> jax.Array:
    b, s, kvh, d = x.shape
    return x.reshape(b, s // t, t, kvh, d).transpose(1, 0, 2, 3, 4)


def _rows_tiles(x: jax.Array, kv_heads: int, t: int) -> jax.Array:
    """[b, s, heads, d] -> the row-major tiles [n, b, kvh, g, t, d] (o, dO, dq)."""
    return _q_tiles(x, kv_heads, t).transpose(0, 1, 3, 4, 2, 5)


def _untile_rows(x: jax.Array) -> jax.Array:
    n, b, kvh, g, t, d = x.shape
    return x.transpose(1, 0, 4, 2, 3, 5).reshape(b, n * t, kvh * g, d)


def _live(q_pos: jax.Array, kv_pos: jax.Array, window: int) -> jax.Array:
    """[nq, nk] bool: whether q tile i may attend to kv tile j, from the tiles' bounds."""
    live = q_pos.max(1)[:, None] >= kv_pos.min(1)[None, :]
    if window:
        live &= q_pos.min(1)[:, None] - kv_pos.max(1)[None, :] < window
    return live


def _scores(qi, kj, pi, pj, window: int) -> tuple[jax.Array, jax.Array]:
    """A tile's scaled float32 scores [b, kvh, g, tq, tk] and its mask [tq, tk]."""
    s = jnp.einsum("bqkgd,bskd->bkgqs", qi, kj, preferred_element_type=_F32)
    diff = pi[:, None] - pj[None, :]
    mask = diff >= 0
    if window:
        mask &= diff < window
    return s * qi.shape[-1] ** -0.5, mask


def _varying(tree: Tree, like: jax.Array) -> Tree:
    """`tree` (new arrays: zeros, fills) varying over the manual axes `like` varies over, as
    `lax.cond` and `lax.scan` need their carries typed alike under shard_map's check_vma."""

    def cast(x: jax.Array) -> jax.Array:
        missing = tuple(sorted(_vma(like) - _vma(x)))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)


def _vma(x: jax.Array) -> frozenset[str]:
    return frozenset(jax.typeof(x).manual_axis_type.varying)


def _sender(axis: str, c: int) -> Callable[[Tree], Tree]:
    perm = [(i, (i + 1) % c) for i in range(c)]
    return lambda tree: jax.tree.map(lambda a: lax.ppermute(a, axis, perm), tree)


def _round(axis: str, block: Tree, state: Tree, step: Callable[[bool, Tree, Tree], Tree]) -> Tree:
    """Hops 0..c-1: `step(first, block, state)` on the block in hand while the next is sent to
    rank + 1 (no send after the last). The first and last hops stand outside the scan."""
    c = lax.axis_size(axis)
    if c == 1:
        return step(True, block, state)
    send = _sender(axis, c)
    ahead = send(block)
    state = step(True, block, state)
    if c > 2:

        def hop(carry: Tree, _: None) -> tuple[Tree, None]:
            held, st = carry
            return (send(held), step(False, held, st)), None

        (ahead, state), _ = lax.scan(hop, (ahead, state), None, length=c - 2)
    return step(False, ahead, state)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _ring(q, k, v, q_pos, kv_pos, axis: str, window: int, t: int) -> jax.Array:
    return _forward(q, k, v, q_pos, kv_pos, axis, window, t)[0]


def _forward(q, k, v, q_pos, kv_pos, axis: str, window: int, t: int):
    """The output and each row's log-sum-exp [n, b, kvh, g, t]."""
    b, s, h, _ = q.shape
    kvh, dv, n = k.shape[2], v.shape[-1], s // t
    # The masks come from the positions alone: under a layer scan whose positions are a loop
    # invariant, jax's partial evaluation would compute every hop's tile masks once outside
    # the loop and hold them all ([hops, tiles, tiles, b, kvh, g, t, t], 97.6 GiB at 32k on a
    # v5p: docs/notes/2026-12-02-ring-attention.md). Tied to q, they stay in their tile.
    q, q_pos = lax.optimization_barrier((q, q_pos))
    qt, qp = _q_tiles(q, kvh, t), q_pos.reshape(n, t)
    rows = (n, b, kvh, h // kvh, t)
    state = (jnp.full(rows, _NEG, _F32), jnp.zeros(rows, _F32), jnp.zeros((*rows, dv), _F32))
    state = _varying(state, q)

    def step(first: bool, block: Tree, st: Tree) -> Tree:
        return _hop_forward(qt, qp, block, st, window)

    block = (_kv_tiles(k, t), _kv_tiles(v, t), kv_pos.reshape(n, t))
    m, total, o = _round(axis, block, state, step)
    safe = jnp.where(total > 0, total, 1.0)
    out = _untile_rows((o / safe[..., None]).astype(q.dtype))
    return out, m + jnp.log(safe)


def _hop_forward(qt, qp, block: Tree, state: Tree, window: int) -> Tree:
    """The online-softmax state after the keys and values of `block`."""
    kt, vt, kp = block
    live = _live(qp, kp, window)

    def tile(carry: Tree, qi, pi, kj, vj, pj) -> Tree:
        m, total, o = carry
        s, mask = _scores(qi, kj, pi, pj, window)
        m_new = jnp.maximum(m, jnp.where(mask, s, _NEG).max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        scale = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(vj.dtype), vj, preferred_element_type=_F32)
        return m_new, total * scale + p.sum(-1), o * scale[..., None] + pv

    def row(_: None, x: Tree) -> tuple[None, Tree]:
        qi, pi, live_i, carry = x

        def col(carry: Tree, y: Tree) -> tuple[Tree, None]:
            kj, vj, pj, ok = y
            run = partial(tile, qi=qi, pi=pi, kj=kj, vj=vj, pj=pj)
            return lax.cond(ok, run, lambda c: c, carry), None

        return None, lax.scan(col, carry, (kt, vt, kp, live_i))[0]

    def tiles(st: Tree) -> Tree:
        return lax.scan(row, None, (qt, qp, live, st))[1]

    return lax.cond(live.any(), tiles, lambda st: st, state)


def _ring_fwd(q, k, v, q_pos, kv_pos, axis: str, window: int, t: int):
    out, lse = _forward(q, k, v, q_pos, kv_pos, axis, window, t)
    return out, (q, k, v, q_pos, kv_pos, out, lse)


def _ring_bwd(axis: str, window: int, t: int, res: Tree, d_out: jax.Array):
    q, k, v, q_pos, kv_pos, out, lse = res
    kvh, n = k.shape[2], q.shape[1] // t
    do = _rows_tiles(d_out, kvh, t)
    delta = (do.astype(_F32) * _rows_tiles(out, kvh, t).astype(_F32)).sum(-1)
    rows = (_q_tiles(q, kvh, t), q_pos.reshape(n, t), do, lse, delta)
    c = lax.axis_size(axis)
    send = _sender(axis, c)

    def step(first: bool, block: Tree, st: Tree) -> Tree:
        dq, behind = st
        # the accumulators of the block in hand, from rank - 1 (none before the first hop)
        arrived = None if first else send(behind)
        dq, grads = _hop_backward(rows, block, dq, window)
        return dq, grads if arrived is None else jax.tree.map(jnp.add, arrived, grads)

    block = (_kv_tiles(k, t), _kv_tiles(v, t), kv_pos.reshape(n, t))
    dq0 = _varying(jnp.zeros((*lse.shape, q.shape[-1]), _F32), q)
    dq, (dk, dv) = _round(axis, block, (dq0, None), step)
    if c > 1:
        dk, dv = send((dk, dv))  # each block's gradients home

    def untile_kv(x: jax.Array, like: jax.Array) -> jax.Array:
        return x.transpose(1, 0, 2, 3, 4).reshape(like.shape).astype(like.dtype)

    return _untile_rows(dq).astype(q.dtype), untile_kv(dk, k), untile_kv(dv, v), None, None


def _hop_backward(rows: Tree, block: Tree, dq: jax.Array, window: int) -> tuple[Any, Any]:
    """dq plus this block's part, and the block's own dK, dV parts (float32, tiled)."""
    qt, qp, do, lse, delta = rows
    kt, vt, kp = block
    live = _live(qp, kp, window)

    def tile(carry: Tree, qi, pi, doi, lse_i, delta_i, dq_i, kj, vj, pj) -> Tree:
        dk, dv = carry
        s, mask = _scores(qi, kj, pi, pj, window)
        p = jnp.where(mask, jnp.exp(s - lse_i[..., None]), 0.0)
        pd = jnp.einsum("bkgqs,bkgqd->bskd", p.astype(doi.dtype), doi, preferred_element_type=_F32)
        dv = dv + pd
        dp = jnp.einsum("bkgqd,bskd->bkgqs", doi, vj, preferred_element_type=_F32)
        ds = (p * (dp - delta_i[..., None]) * qi.shape[-1] ** -0.5).astype(qi.dtype)
        dq_i = dq_i + jnp.einsum("bkgqs,bskd->bkgqd", ds, kj, preferred_element_type=_F32)
        dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qi, preferred_element_type=_F32)
        return (dk, dv), dq_i

    def col(dq: jax.Array, y: Tree) -> tuple[jax.Array, Tree]:
        kj, vj, pj, live_j = y
        grads = _varying((jnp.zeros(kj.shape, _F32), jnp.zeros(vj.shape, _F32)), dq)

        def row(carry: Tree, x: Tree) -> tuple[Tree, jax.Array]:
            qi, pi, doi, lse_i, delta_i, dq_i, ok = x
            run = partial(tile, qi=qi, pi=pi, doi=doi, lse_i=lse_i, delta_i=delta_i, dq_i=dq_i,
                          kj=kj, vj=vj, pj=pj)  # fmt: skip
            return lax.cond(ok, run, lambda c: (c, dq_i), carry)

        grads, dq = lax.scan(row, grads, (qt, qp, do, lse, delta, dq, live_j))
        return dq, grads

    def tiles(dq: jax.Array) -> tuple[Any, Any]:
        return lax.scan(col, dq, (kt, vt, kp, live.T))

    def skip(dq: jax.Array) -> tuple[Any, Any]:
        return dq, _varying((jnp.zeros(kt.shape, _F32), jnp.zeros(vt.shape, _F32)), dq)

    return lax.cond(live.any(), tiles, skip, dq)


_ring.defvjp(_ring_fwd, _ring_bwd)
