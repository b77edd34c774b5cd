"""Multi-head latent attention's projections in the reference step (DeepSeek's MLA), and the
RMSNorm the step's layers and MLA's bottlenecks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from .attention import rotary, rotate
from .spec import ModelSpec

_NORM_EPS = 1e-5
Params = dict[str, Any]


def latent_qkv(
    h: jax.Array, p: Params, *, model: ModelSpec, matmul: Callable[..., Any], at: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Multi-head latent attention's q, k and v from the normed residual `h`: the query
    through its normed low-rank bottleneck (or one full-rank projection) to every head's
    nope and rope parts; one down-projection to the kv bottleneck and a rope key shared by
    the heads, the bottleneck normed and projected up to each head's nope key and value.
    Rotary positions (`at`: attention.rotary's) on the rope parts; a key is its nope part and
    the shared rope part. `matmul` the step's projection (its precision, `Step._matmul`)."""
    m, mm = model, matmul
    if m.q_lora_rank:
        latent = rms_norm(mm("bsd,dr->bsr", h, p["wq_a"]), p["q_norm"])
        q = mm("bsr,rhk->bshk", latent, p["wq_b"])
    else:
        q = mm("bsd,dhk->bshk", h, p["wq"])
    q = checkpoint_name(q, "query")
    down = mm("bsd,dr->bsr", h, p["wkv_a"])
    latent, rope_key = down[..., : m.kv_lora_rank], down[..., m.kv_lora_rank :]
    up = mm("bsr,rhk->bshk", rms_norm(latent, p["kv_norm"]), p["wkv_b"])
    k_nope, v = up[..., : m.qk_nope_head_dim], up[..., m.qk_nope_head_dim :]
    sin, cos = rotary(at, m.qk_rope_head_dim)
    q_nope, q_rope = q[..., : m.qk_nope_head_dim], q[..., m.qk_nope_head_dim :]
    q = jnp.concatenate([q_nope, rotate(q_rope, sin, cos)], axis=-1)
    rope_key = jnp.broadcast_to(rotate(rope_key[:, :, None, :], sin, cos), q_rope.shape)
    k = checkpoint_name(jnp.concatenate([k_nope, rope_key], axis=-1), "key")
    return q, k, checkpoint_name(v, "value")


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _NORM_EPS)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)
