"""The reference training step in plain jax: a decoder-only LM (DESIGN.md section 7).

Embedding, RMSNorm, grouped-query attention with a causal mask and rotary positions, SwiGLU
MLP, layers under `lax.scan` with a remat policy, cross-entropy in float32, Adam. Parameters,
Adam moments and activations are sharded by the logical rules of `layout`. Inputs can be
`jax.ShapeDtypeStruct`s (to compile for thousands of devices without allocating) or real
arrays (to train on this machine's devices).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .attention import attention
from .layout import Roles, check_fit, param_shapes, roles
from .spec import ModelSpec, TrainSpec

_BETAS = (0.9, 0.95)
_EPS = 1e-8
_NORM_EPS = 1e-5

Params = dict[str, Any]


@dataclass(frozen=True, eq=False)
class Step:
    """The step for one mesh, model and train spec: `fn(params, opt_state, batch)` returns the
    new params and optimizer state (both donated) and the loss."""

    mesh: Mesh
    model: ModelSpec
    train: TrainSpec
    roles: Roles

    def spec(self, logical: tuple[str | None, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, P(*self.roles.mesh_axes(logical)))

    @cached_property
    def param_shardings(self) -> Params:
        return {k: self.spec(axes) for k, (_, axes) in param_shapes(self.model).items()}

    @cached_property
    def batch_sharding(self) -> NamedSharding:
        return self.spec(("batch", "seq"))

    def abstract_args(self) -> tuple[Any, Any, Any]:
        """ShapeDtypeStructs (with shardings) for params, optimizer state and a batch."""
        shapes = param_shapes(self.model)
        pdt, odt = jnp.dtype(self.train.param_dtype), jnp.dtype(self.train.opt_state_dtype)

        def tree(dtype: Any) -> Params:
            return {
                k: jax.ShapeDtypeStruct(s, dtype, sharding=self.param_shardings[k])
                for k, (s, _) in shapes.items()
            }

        count = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(self.mesh, P()))
        tokens = jax.ShapeDtypeStruct(
            (self.train.global_batch, self.model.seq_len), jnp.int32, sharding=self.batch_sharding
        )
        return (
            tree(pdt),
            {"m": tree(odt), "v": tree(odt), "count": count},
            {
                "tokens": tokens,
                "targets": tokens,
            },
        )

    @cached_property
    def fn(self) -> Any:
        """The jitted step (params and optimizer state donated); `fn.lower(*abstract_args())`
        compiles it ahead of time."""
        params, opt, batch = self.abstract_args()
        shardings = jax.tree.map(lambda s: s.sharding, (params, opt, batch))
        replicated = NamedSharding(self.mesh, P())
        return jax.jit(
            self._step,
            in_shardings=shardings,
            out_shardings=(shardings[0], shardings[1], replicated),
            donate_argnums=(0, 1),
        )

    def init(self, key: jax.Array) -> tuple[Params, Params]:
        """Real, sharded parameters (scaled normal; norms 1) and a zero optimizer state."""
        params, opt, _ = self.abstract_args()

        def make(key: jax.Array) -> tuple[Params, Params]:
            keys = dict(zip(params, jax.random.split(key, len(params)), strict=True))
            p = {
                k: (
                    jnp.ones(a.shape, a.dtype)
                    if k.endswith("norm")
                    else jax.random.normal(keys[k], a.shape, a.dtype) * self._init_scale(k)
                )
                for k, a in params.items()
            }
            zeros = {k: jnp.zeros(a.shape, a.dtype) for k, a in opt["m"].items()}
            return p, {"m": zeros, "v": dict(zeros), "count": jnp.zeros((), jnp.int32)}

        out = jax.tree.map(lambda a: a.sharding, (params, opt))
        return jax.jit(make, out_shardings=out)(key)

    def _init_scale(self, name: str) -> float:
        """1 / sqrt(fan-in): the contracted width of each weight."""
        m = self.model
        fan_in = {"layers/w_down": m.d_ff, "layers/wo": m.num_heads * m.head_dim}
        return float(fan_in.get(name, m.d_model)) ** -0.5

    # -- the computation ----------------------------------------------------------------------

    def _step(self, params: Params, opt: Params, batch: Params) -> tuple[Params, Params, Any]:
        loss, grads = jax.value_and_grad(self.loss)(params, batch)
        count = opt["count"] + 1
        b1, b2 = _BETAS
        odt = jnp.dtype(self.train.opt_state_dtype)
        m = {k: (b1 * opt["m"][k] + (1 - b1) * g).astype(odt) for k, g in grads.items()}
        v = {k: (b2 * opt["v"][k] + (1 - b2) * g * g).astype(odt) for k, g in grads.items()}
        lr = self.train.learning_rate * jnp.sqrt(1 - b2**count) / (1 - b1**count)
        new = {
            k: (p - lr * m[k] / (jnp.sqrt(v[k]) + _EPS)).astype(p.dtype) for k, p in params.items()
        }
        return new, {"m": m, "v": v, "count": count}, loss

    def loss(self, params: Params, batch: Params) -> jax.Array:
        """Mean next-token cross-entropy (float32) over the batch."""
        cdt = jnp.dtype(self.train.compute_dtype)
        act = self.spec(("batch", "seq", None))
        # The table gathered over FSDP first: the lookup's output then comes out sharded by
        # batch, and its gradient is reduce-scattered back, as for every other weight.
        table = jax.lax.with_sharding_constraint(
            params["embed"].astype(cdt), self.spec(("vocab", None))
        )
        x = jnp.take(table, batch["tokens"], axis=0)
        x = jax.lax.with_sharding_constraint(x, act)
        layers = {k.split("/", 1)[1]: v for k, v in params.items() if k.startswith("layers/")}
        layer: Callable[..., Any] = partial(self._layer, act=act)
        if self.train.remat != "none":
            layer = jax.checkpoint(layer, policy=_POLICIES[self.train.remat_text]())
        x, _ = jax.lax.scan(layer, x, layers)
        x = _rms_norm(x, params["final_norm"])
        unembed = params["embed"].T if self.model.tied_embeddings else params["unembed"]
        logits = jnp.einsum("bsd,dv->bsv", x, unembed.astype(cdt))
        logits = jax.lax.with_sharding_constraint(logits, self.spec(("batch", "seq", "vocab")))
        return jnp.mean(_cross_entropy(logits, batch["targets"]))

    def _layer(self, x: jax.Array, p: Params, *, act: NamedSharding) -> tuple[jax.Array, None]:
        cdt = x.dtype
        h = _rms_norm(x, p["attn_norm"])
        q, k, v = (jnp.einsum("bsd,dhk->bshk", h, p[w].astype(cdt)) for w in ("wq", "wk", "wv"))
        sin, cos = _rotary(self.model.seq_len, self.model.head_dim)
        q, k = _rotate(q, sin, cos), _rotate(k, sin, cos)
        o = attention(q, k, v, kind=self.train.attention, mesh=self.mesh, roles=self.roles)
        x = x + jnp.einsum("bshk,hkd->bsd", o, p["wo"].astype(cdt))
        x = jax.lax.with_sharding_constraint(x, act)
        h = _rms_norm(x, p["mlp_norm"])
        gate = jnp.einsum("bsd,df->bsf", h, p["w_gate"].astype(cdt))
        up = jnp.einsum("bsd,df->bsf", h, p["w_up"].astype(cdt))
        x = x + jnp.einsum("bsf,fd->bsd", jax.nn.silu(gate) * up, p["w_down"].astype(cdt))
        return jax.lax.with_sharding_constraint(x, act), None


_POLICIES: dict[str, Callable[[], Any]] = {
    "full": lambda: jax.checkpoint_policies.nothing_saveable,
    "dots": lambda: jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def make_step(mesh: Mesh, model: ModelSpec, train: TrainSpec, *, batch_axes: Any) -> Step:
    """The reference step on `mesh`; checks that every sharded dim divides by its axis."""
    names = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    r = roles(tuple(mesh.shape.items()), names)
    check_fit(model, train, r)
    return Step(mesh, model, train, r)


@jax.custom_vjp
def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
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


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _NORM_EPS)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def _rotary(seq_len: int, head_dim: int) -> tuple[jax.Array, jax.Array]:
    half = head_dim // 2
    freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * freq[None, :]
    return jnp.sin(angle), jnp.cos(angle)


def _rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotary position embedding on [batch, seq, heads, head_dim] (halves rotated)."""
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    s, c = sin[None, :, None, :], cos[None, :, None, :]
    return jnp.concatenate([a * c - b * s, a * s + b * c], axis=-1).astype(x.dtype)
