"""Ring attention (workload/ring.py) on 8 CPU devices against attention on one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from loadax_mesh import MeshConfigError
from loadax_mesh.workload.ring import _live, _tile, ring_attention, shard_positions

SEQ, BATCH, HEADS, KV_HEADS, DIM, V_DIM = 64, 2, 4, 2, 16, 8


def reference(q, k, v, window: int) -> jax.Array:
    """Attention of the whole sequence in order, the score matrix written out (float32)."""
    b, s, h, d = q.shape
    qg = q.reshape(b, s, k.shape[2], h // k.shape[2], d)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k) * d**-0.5
    pos = jnp.arange(s)
    diff = pos[:, None] - pos[None, :]
    mask = (diff >= 0) & ((diff < window) if window else True)
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, h, v.shape[-1])


def _inputs():
    keys = jax.random.split(jax.random.key(7), 4)
    shapes = [(BATCH, SEQ, HEADS, DIM), (BATCH, SEQ, KV_HEADS, DIM)]
    shapes += [(BATCH, SEQ, KV_HEADS, V_DIM), (BATCH, SEQ, HEADS, V_DIM)]
    return [jax.random.normal(key, shape) for key, shape in zip(keys, shapes, strict=True)]


def _ring(shards: int, window: int, tile: int = 4):
    mesh = Mesh(np.array(jax.devices()[:shards]), ("seq",))
    spec = P(None, "seq")

    def local(q, k, v, pos):
        return ring_attention(
            q, k, v, axis_name="seq", q_pos=pos, kv_pos=pos, window=window, tile=tile
        )

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3 + (P("seq"),), out_specs=spec)


@pytest.mark.slow
@pytest.mark.parametrize("shards", [4, 8])
@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("window", [0, 5])
def test_ring_equals_attention_on_one_device(shards, balanced, window):
    """Output and gradients of q, k, v (of a weighted sum of the output) equal the single-device
    attention's, the tokens in the shards' order: contiguous or dual-chunk-swap."""
    q, k, v, w = _inputs()
    order = jnp.asarray(shard_positions(SEQ, shards, balanced=balanced).reshape(-1))
    ring = _ring(shards, window)

    def ring_loss(q, k, v):
        out = ring(q, k, v, order)
        return (out * w[:, order]).sum(), out

    def one_loss(q, k, v):
        out = reference(q, k, v, window)
        return (out * w).sum(), out

    (loss, out), grads = jax.jit(jax.value_and_grad(ring_loss, (0, 1, 2), has_aux=True))(
        *(x[:, order] for x in (q, k, v))
    )
    (want_loss, want), want_grads = jax.value_and_grad(one_loss, (0, 1, 2), has_aux=True)(q, k, v)
    assert out.shape == (BATCH, SEQ, HEADS, V_DIM)
    np.testing.assert_allclose(out, want[:, order], atol=2e-6)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for got, expected in zip(grads, want_grads, strict=True):
        assert float(jnp.abs(expected).max()) > 0.5  # the gradients are not all zero
        np.testing.assert_allclose(got, expected[:, order], atol=5e-6)


@pytest.mark.slow
def test_bfloat16_inputs_stay_close_to_float32():
    """bfloat16 q, k, v (matmuls in bfloat16, the merge in float32): within bfloat16's error of
    the float32 reference, and the output in bfloat16."""
    q, k, v, _ = _inputs()
    order = jnp.asarray(shard_positions(SEQ, 4, balanced=True).reshape(-1))
    half = [x[:, order].astype(jnp.bfloat16) for x in (q, k, v)]
    out = jax.jit(_ring(4, 0))(*half, order)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), reference(q, k, v, 0)[:, order], atol=3e-2)


@pytest.mark.slow
def test_the_compiled_ring_step_passes_blocks_by_collective_permute():
    """The jitted forward and backward of a ring step: collective-permutes (K/V, positions and
    the dK/dV accumulators) and the skipping conditionals; no all-gather of the sequence."""
    q, k, v, w = _inputs()
    order = jnp.asarray(shard_positions(SEQ, 4, balanced=False).reshape(-1))
    ring = _ring(4, 0)

    def loss(q, k, v):
        return (ring(q, k, v, order) * w).sum()

    text = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, k, v).compile().as_text()
    assert "collective-permute" in text
    assert "conditional" in text
    assert "all-gather" not in text


@pytest.mark.slow
def test_a_layer_scan_holds_no_tile_masks_of_every_hop():
    """Under a scan of layers whose positions are a loop invariant (the step's), the layers'
    forward and backward hold what they hold with the positions scanned per layer: no tile
    masks of every hop computed once outside the loop and kept (7x the temp before
    ring.py tied the positions to q)."""
    seq, tile = 2048, 256
    mesh = Mesh(np.array(jax.devices()[:4]), ("seq",))
    spec = P(None, "seq")
    pos = jnp.asarray(shard_positions(seq, 4, balanced=True).reshape(-1))

    def local(x, at):
        kv = x[:, :, :KV_HEADS]
        return ring_attention(x, kv, kv, axis_name="seq", q_pos=at, kv_pos=at, tile=tile)

    attend = jax.shard_map(local, mesh=mesh, in_specs=(spec, P("seq")), out_specs=spec)

    def invariant(x):
        y, _ = jax.lax.scan(lambda c, _: (attend(c, pos) + c, None), x, None, length=2)
        return (y.astype(jnp.float32) ** 2).sum()

    def scanned(x):
        y, _ = jax.lax.scan(lambda c, at: (attend(c, at) + c, None), x, jnp.stack([pos, pos]))
        return (y.astype(jnp.float32) ** 2).sum()

    x = jax.ShapeDtypeStruct((1, seq, HEADS, 64), jnp.bfloat16)

    def temp(f) -> int:
        return jax.jit(jax.grad(f)).lower(x).compile().memory_analysis().temp_size_in_bytes

    assert temp(invariant) <= 1.2 * temp(scanned)


def test_shard_positions_are_the_dual_chunk_swap_order():
    # MaxText's reorder_sequence docstring, cp = 2: [0..7] -> [0, 1, 6, 7, 2, 3, 4, 5]
    assert shard_positions(8, 2, balanced=True).tolist() == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert shard_positions(8, 2, balanced=False).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    every = shard_positions(48, 4, balanced=True)
    assert sorted(every.reshape(-1).tolist()) == list(range(48))
    with pytest.raises(MeshConfigError, match=r"seq_len=12.*8 chunks"):
        shard_positions(12, 4, balanced=True)
    with pytest.raises(MeshConfigError, match="seq_len=10"):
        shard_positions(10, 4, balanced=False)


def _tiles(positions: np.ndarray, t: int) -> np.ndarray:
    return positions.reshape(-1, t)


@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("window", [0, 3, 9])
def test_tiles_are_skipped_exactly_where_the_mask_excludes_them(balanced, window):
    """A tile is computed iff some query of it attends to some key of it (tiles of consecutive
    positions): no FLOPs for excluded pairs, none skipped wrongly."""
    c, s = 4, 64
    held = shard_positions(s, c, balanced=balanced)
    t = _tile(s // c, 4)
    for i in range(c):
        for j in range(c):
            qp, kp = _tiles(held[i], t), _tiles(held[j], t)
            diff = qp[:, None, :, None] - kp[None, :, None, :]
            attends = (diff >= 0) & ((diff < window) if window else True)
            live = np.asarray(_live(jnp.asarray(qp), jnp.asarray(kp), window))
            assert (live == attends.any(axis=(2, 3))).all()


def test_causal_work_per_hop_is_half_a_block_when_balanced():
    """Causal, balanced: every hop after the first computes half of the block's tiles (PyTorch's
    head-tail); contiguous: the blocks of later shards none, those of earlier shards all."""
    c, s, t = 4, 64, 4
    for balanced in (True, False):
        held = shard_positions(s, c, balanced=balanced)
        for i in range(c):
            for hop in range(1, c):
                j = (i - hop) % c  # the block device i holds at this hop
                live = np.asarray(_live(jnp.asarray(_tiles(held[i], t)),
                                        jnp.asarray(_tiles(held[j], t)), 0))  # fmt: skip
                if balanced:
                    assert live.mean() == 0.5
                else:
                    assert live.mean() == (1.0 if j < i else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(("balanced", "window", "poisoned"), [(False, 0, SEQ - 1), (True, 5, 0)])
def test_excluded_tiles_are_not_computed(balanced, window, poisoned):
    """A NaN value at one key reaches exactly the rows of the query tiles computed with its
    tile (0 x NaN is NaN in a matmul): every other row equals attention without that key's
    value, so the tiles and hops the mask excludes ran no matmul, forward or backward."""
    q, k, v, w = _inputs()
    c, t = 4, 4
    order = shard_positions(SEQ, c, balanced=balanced).reshape(-1)
    tiles = order.reshape(-1, t)
    held = tiles[(tiles == poisoned).any(1)]
    diff = tiles[:, :, None] - held.reshape(-1)[None, None, :]
    hit = ((diff >= 0) & ((diff < window) if window else True)).any((1, 2)).repeat(t)
    assert 0 < hit.sum() < SEQ // 4  # few rows see the poisoned tile
    nan_v = v.at[:, poisoned].set(jnp.nan)
    ring = _ring(c, window, tile=t)

    def loss(q, k, v):
        out = ring(q, k, v, jnp.asarray(order))
        return (out * w[:, order]).sum(), out

    (_, out), dq = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        *(x[:, order] for x in (q, k, nan_v))
    )
    clean = reference(q, k, v.at[:, poisoned].set(0.0), window)[:, order]
    assert bool(jnp.isnan(out[:, hit]).all())
    np.testing.assert_allclose(out[:, ~hit], clean[:, ~hit], atol=2e-6)
    assert bool(jnp.isfinite(dq[:, ~hit]).all())


def test_bad_inputs_name_the_field():
    q, k, v, _ = _inputs()
    pos = jnp.arange(SEQ)
    with pytest.raises(MeshConfigError, match="kv_pos has shape"):
        ring_attention(q, k, v, axis_name="seq", q_pos=pos, kv_pos=pos[:8])
    with pytest.raises(MeshConfigError, match="k has shape"):
        ring_attention(q, k[:, :, :1].repeat(3, 2), v, axis_name="seq", q_pos=pos, kv_pos=pos)
    with pytest.raises(MeshConfigError, match="window=-1"):
        ring_attention(q, k, v, axis_name="seq", q_pos=pos, kv_pos=pos, window=-1)


def test_tiles_divide_a_chunk():
    assert _tile(8192, 1024) == 1024
    assert _tile(48, 1024) == 24  # half the shard: the balanced order's chunk
    assert _tile(24, 5) == 4
    assert _tile(1, 1024) == 1
