"""Causal grouped-query attention, global or local, as production trainers run it per platform.

`flash`: on TPU, jax's splash-attention Pallas kernel (splash.py); on GPU
`jax.nn.dot_product_attention` with cuDNN; elsewhere the same function's XLA path. `plain`:
the score matrix written out in float32. q is [batch, seq, heads, head_dim], k and v
[batch, seq, kv_heads, head_dim] (v's head_dim may be narrower: latent attention's); the result
has q's shape with v's head_dim. A layer's `window` > 0 makes it local: each query sees itself
and the `window` - 1 keys before it (cuDNN's sliding window, splash's local mask, the XLA
path's local window, a masked score matrix); 0 is the whole causal prefix.

With a `seq` axis (context parallelism, TrainSpec.context_strategy "all_gather") each device
holds its queries and gathers the keys and values over the axis each layer (the gather's
transpose reduce-scatters their gradients; libtpu runs that as an all-reduce whose slice it
fuses into the rotary's backward). Its queries then sit at positions that are not
those of the gathered keys' first rows, so masks are built from positions: each token slot's
position (`positions`, context.py's order: contiguous, or load-balanced) rather than from the
diagonal of the query block. `context_strategy` "ring" passes key and value blocks round
the axis instead (`ring`, the call site of ring.py's kernel).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..hardware.traits import attention_kernel
from .kernels import gathered, shard_map_mesh
from .layout import Roles
from .ring import ring_attention
from .splash import splash


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    kind: str,
    mesh: Mesh,
    roles: Roles,
    window: int = 0,
    positions: np.ndarray | None = None,
    strategy: str = "all_gather",
) -> jax.Array:
    """Attention of `kind` ("flash" or "plain") with the step's mesh and sharding roles over
    `window` (0: global); `positions`: each token slot's position (None: contiguous);
    `strategy`: how a `seq` axis reaches the other shards' keys (TrainSpec.context_strategy)."""
    if strategy == "ring" and roles.size("seq") > 1:
        return ring(q, k, v, mesh, roles, window=window, positions=positions)
    runs = attention_kernel(kind, mesh.devices.flat[0].platform)
    if runs == "splash":
        return splash(q, k, v, mesh, roles, window=window, positions=positions)
    if runs == "plain":
        # Keys and values whole along the sequence: an all-gather over the sequence axis.
        kv = NamedSharding(mesh, P(*roles.mesh_axes(("batch", None, "kv_heads", None))))
        k, v = (jax.lax.with_sharding_constraint(a, kv) for a in (k, v))
        at = _positions(q.shape[1], positions)
        return _plain(q, k, v, allowed(at, at, window))
    # jax's function takes values as wide as the keys: latent attention's narrower values are
    # padded with zeros, which add zero columns to the output, cut off again.
    width = v.shape[-1]
    v = jnp.pad(v, ((0, 0),) * 3 + ((0, q.shape[-1] - width),))
    out = _fused(q, k, v, mesh, roles, cudnn=runs == "cudnn", window=window, positions=positions)
    return out[..., :width]


def allowed(q_pos: jax.Array, kv_pos: jax.Array, window: int) -> jax.Array:
    """Which keys each query sees [queries, keys]: those at or before its position, and with a
    `window`, after its position less the window."""
    seen = kv_pos[None, :] <= q_pos[:, None]
    if window:
        seen &= kv_pos[None, :] > q_pos[:, None] - window
    return seen


def _positions(seq_len: int, positions: np.ndarray | None) -> jax.Array:
    return jnp.arange(seq_len) if positions is None else jnp.asarray(positions)


def _fused(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mesh: Mesh,
    r: Roles,
    *,
    cudnn: bool,
    window: int,
    positions: np.ndarray | None,
) -> jax.Array:
    """`jax.nn.dot_product_attention` (its cuDNN kernel where `cudnn`).

    Without a `seq` axis and outside a pipeline stage the compiler places the call (jax's
    cuDNN partitioner: each device on its rows and heads), causal or with its local window.
    Inside a stage (a `shard_map` manual over the pipeline axis) that partitioner cannot read
    the stage's partly manual shardings (jax 0.10.2: "'GSPMDSharding' object has no attribute
    'spec'"), and over a `seq` axis it refuses queries sharded unlike the keys ("Query, key
    and value should have same sharding"): there the call runs under a `shard_map` manual over
    the other axes too, each device on its rows, heads and queries, the keys and values
    gathered whole along the sequence (`kernels.gathered`), with a mask from positions when
    the sequence is split (`allowed`: cuDNN's causal mask is the query block's diagonal,
    right only for the first shard; cuDNN takes the mask as a bias [1, 1, queries, keys] in
    the compute dtype and, in jax 0.10.2, returns its gradient too). The XLA path takes the
    same `shard_map`, so that the CPU tests run the code the GPU step runs."""
    local = (window - 1, 0) if window else None

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *pos: jax.Array) -> jax.Array:
        how: Literal["cudnn"] | None = "cudnn" if cudnn else None
        if pos:  # this device's query positions; the gathered keys' are every position
            k, v = (gathered(a, r.seq, 1) for a in (k, v))
            mask = allowed(pos[0], _positions(k.shape[1], positions), window)[None, None]
            return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=how)
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=True, local_window_size=local, implementation=how
        )

    where = shard_map_mesh(mesh)
    split = r.size("seq") > 1
    if not split and "axis_names" not in where:
        return kernel(q, k, v)
    q_spec = P(*r.mesh_axes(("batch", "seq", "heads", None)))
    if not split:
        kv_spec = P(*r.mesh_axes(("batch", None, "heads", None)))
        run = jax.shard_map(
            kernel, **where, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec, check_vma=False
        )
        return run(q, k, v)
    kv_spec = P(*r.mesh_axes(("batch", "seq", "kv_heads", None)))  # gathered inside
    run = jax.shard_map(
        kernel,
        **where,
        in_specs=(q_spec, kv_spec, kv_spec, P(r.seq)),
        out_specs=q_spec,
        check_vma=False,
    )
    return run(q, k, v, _positions(q.shape[1], positions))


def ring(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mesh: Mesh,
    r: Roles,
    *,
    window: int,
    positions: np.ndarray | None,
) -> jax.Array:
    """`context_strategy="ring"`: ring.py's `ring_attention` on each device under a
    `shard_map` manual over every axis: the device's own q, k, v ([rows, seq / c, heads or
    kv_heads, head_dim], values possibly narrower) and its slots' positions [seq / c] (of its
    queries, and of the key and value block it starts with), the layer's window (0: global);
    key and value blocks go round the `seq` axis. Returns q's shape with v's head_dim."""
    q_spec = P(*r.mesh_axes(("batch", "seq", "heads", None)))
    kv_spec = P(*r.mesh_axes(("batch", "seq", "kv_heads", None)))

    def local(q: jax.Array, k: jax.Array, v: jax.Array, at: jax.Array) -> jax.Array:
        return ring_attention(q, k, v, axis_name=str(r.seq), q_pos=at, kv_pos=at, window=window)

    run = jax.shard_map(
        local,
        **shard_map_mesh(mesh),
        in_specs=(q_spec, kv_spec, kv_spec, P(r.seq)),
        out_specs=q_spec,
        check_vma=False,
    )
    return run(q, k, v, _positions(q.shape[1], positions))


def _plain(q: jax.Array, k: jax.Array, v: jax.Array, seen: jax.Array) -> jax.Array:
    b, s, h, d = q.shape
    groups = h // k.shape[2]
    qg = q.reshape(b, s, k.shape[2], groups, d)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k).astype(jnp.float32) * d**-0.5
    scores = jnp.where(seen, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, h, v.shape[-1])


def rotary(positions: int | np.ndarray, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """The rotary position embedding's sin and cos [seq, head_dim / 2] (base 10000) at each
    token slot's position (`positions`, context.py's order; an int n: 0 .. n - 1)."""
    half = head_dim // 2
    freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    at = (
        jnp.arange(positions, dtype=jnp.float32)
        if isinstance(positions, int)
        else jnp.asarray(positions, dtype=jnp.float32)
    )
    angle = at[:, None] * freq[None, :]
    return jnp.sin(angle), jnp.cos(angle)


def rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotary position embedding on [batch, seq, heads, head_dim] (halves rotated), in the
    compute dtype as Hugging Face's LLaMA does: in float32 the rotation's fusions cost libtpu's
    code generation about 4 s of the 8B step's compile
    (docs/notes/2026-11-25-step-time-vs-measured-runs.md)."""
    a, b = jnp.split(x, 2, axis=-1)
    s, c = (t[None, :, None, :].astype(x.dtype) for t in (sin, cos))
    return jnp.concatenate([a * c - b * s, a * s + b * c], axis=-1)
