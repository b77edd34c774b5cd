"""Causal grouped-query attention, as production trainers run it per platform.

`flash`: on TPU, jax's splash-attention Pallas kernel under `shard_map` (heads over the tensor
axis, query blocks over the sequence axis, keys and values gathered along the sequence); on GPU
`jax.nn.dot_product_attention` with cuDNN; elsewhere the same function's XLA path. `plain`:
the score matrix written out in float32. q is [batch, seq, heads, head_dim], k and v
[batch, seq, kv_heads, head_dim] (v's head_dim may be narrower: latent attention's); the result
has q's shape with v's head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..hardware.traits import attention_kernel
from .kernels import shard_map_mesh
from .layout import Roles, splash_blocks


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, kind: str, mesh: Mesh, roles: Roles
) -> jax.Array:
    """Attention of `kind` ("flash" or "plain") with the step's mesh and sharding roles."""
    runs = attention_kernel(kind, mesh.devices.flat[0].platform)
    if runs == "splash":
        return _splash(q, k, v, mesh, roles)
    # Keys and values whole along the sequence: an all-gather over the sequence axis.
    kv = NamedSharding(mesh, P(*roles.mesh_axes(("batch", None, "kv_heads", None))))
    k, v = (jax.lax.with_sharding_constraint(a, kv) for a in (k, v))
    if runs == "plain":
        return _plain(q, k, v)
    # jax's function takes values as wide as the keys: latent attention's narrower values are
    # padded with zeros, which add zero columns to the output, cut off again.
    width = v.shape[-1]
    v = jnp.pad(v, ((0, 0),) * 3 + ((0, q.shape[-1] - width),))
    return _fused(q, k, v, mesh, roles, cudnn=runs == "cudnn")[..., :width]


def _fused(
    q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh, r: Roles, *, cudnn: bool
) -> jax.Array:
    """`jax.nn.dot_product_attention` (its cuDNN kernel where `cudnn`). Inside a pipeline
    stage (a `shard_map` manual over the pipeline axis) jax's custom partitioner for the cuDNN
    kernel cannot read the stage's partly manual shardings (jax 0.10.2: "'GSPMDSharding'
    object has no attribute 'spec'"), so there the call runs under a `shard_map` manual over
    the other axes too, each device on its rows and heads, the sequence whole (how that
    partitioner splits it); elsewhere the compiler places it."""

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        if cudnn:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    where = shard_map_mesh(mesh)
    if "axis_names" not in where:
        return kernel(q, k, v)
    # (the XLA path needs no shard_map there; it takes the same one, so that the CPU tests
    # of the pipelined step's losses run the code the GPU step runs)
    spec = P(*r.mesh_axes(("batch", None, "heads", None)))
    run = jax.shard_map(kernel, **where, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    return run(q, k, v)


def _plain(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    b, s, h, d = q.shape
    groups = h // k.shape[2]
    qg = q.reshape(b, s, k.shape[2], groups, d)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k).astype(jnp.float32) * d**-0.5
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, h, v.shape[-1])


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh, r: Roles) -> jax.Array:
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernels,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
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
    mask = masks.MultiHeadMask([masks.CausalMask((s, s)) for _ in range(h)])
    kernel = kernels.make_splash_mha(
        mask, block_sizes=sizes, head_shards=r.size("model"), q_seq_shards=r.size("seq")
    )
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(mesh, P(r.model, r.seq)))
    batch = r.mesh_axes(("batch",))[0]
    q_spec = P(batch, r.model, r.seq, None)
    kv_spec = P(batch, r.model, None, None)

    def local(kernel: kernels.SplashAttentionKernel, q: jax.Array, k: jax.Array, v: jax.Array):
        return jax.vmap(kernel)(q, k, v)

    sharded = jax.shard_map(
        local,
        **shard_map_mesh(mesh),  # inside a pipeline stage too
        in_specs=(kernel_spec, q_spec, kv_spec, kv_spec),
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


def rotary(seq_len: int, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """The rotary position embedding's sin and cos [seq_len, head_dim / 2] (base 10000)."""
    half = head_dim // 2
    freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * freq[None, :]
    return jnp.sin(angle), jnp.cos(angle)


def rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotary position embedding on [batch, seq, heads, head_dim] (halves rotated), in the
    compute dtype as Hugging Face's LLaMA does: in float32 the rotation's fusions cost libtpu's
    code generation about 4 s of the 8B step's compile
    (docs/notes/2026-11-25-step-time-vs-measured-runs.md)."""
    a, b = jnp.split(x, 2, axis=-1)
    s, c = (t[None, :, None, :].astype(x.dtype) for t in (sin, cos))
    return jnp.concatenate([a * c - b * s, a * s + b * c], axis=-1)
