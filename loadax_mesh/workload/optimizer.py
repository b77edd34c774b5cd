"""The reference step's state and its update: the initial parameters (scaled normal, norms 1)
and Adam (bias-corrected), its moments placed as the parameters or, under ZeRO-1
(TrainSpec.optimizer_over_data), cut over the data-parallel axes too (zero.py says where).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .layout import Logical, Roles, param_shapes
from .pipeline import to_stages
from .spec import ModelSpec, TrainSpec
from .stages import Stages
from .zero import optimizer_axes

Params = dict[str, Any]
_BETAS = (0.9, 0.95)
_EPS = 1e-8


def initial_state(
    model: ModelSpec,
    train: TrainSpec,
    stages: Stages | None,
    moments: Params,
    shardings: tuple[Params, Params],
    key: jax.Array,
) -> tuple[Params, Params]:
    """Parameters drawn from `key` (in the stage layout with `stages`) and zero moments shaped
    as `moments`, placed as `shardings` (the parameters', the optimizer state's)."""
    shapes = param_shapes(model)
    dtype = jnp.dtype(train.param_dtype)

    def make(key: jax.Array) -> tuple[Params, Params]:
        keys = dict(zip(shapes, jax.random.split(key, len(shapes)), strict=True))
        p = {
            k: (
                jnp.ones(s, dtype)
                if k.endswith("norm")
                else jax.random.normal(keys[k], s, dtype) * _init_scale(model, k)
            )
            for k, (s, _) in shapes.items()
        }
        p = p if stages is None else to_stages(p, stages)
        zeros = {k: jnp.zeros(a.shape, a.dtype) for k, a in moments.items()}
        return p, {"m": zeros, "v": dict(zeros), "count": jnp.zeros((), jnp.int32)}

    return jax.jit(make, out_shardings=shardings)(key)


def _init_scale(m: ModelSpec, name: str) -> float:
    """1 / sqrt(fan-in): the contracted width of each weight."""
    fan_in = {
        "w_down": m.d_ff,
        "wo": m.num_heads * (m.v_head_dim if m.attention == "mla" else m.head_dim),
        "wq_b": m.q_lora_rank,
        "wkv_b": m.kv_lora_rank,
        "we_down": m.moe_d_ff,
        "ws_down": m.num_shared_experts * m.moe_d_ff,
    }
    return float(fan_in.get(name.rsplit("/", 1)[-1], m.d_model)) ** -0.5


def moment_shardings(
    mesh: Mesh,
    roles: Roles,
    shapes: dict[str, tuple[tuple[int, ...], Logical]],
    train: TrainSpec,
    params: Params,
) -> Params:
    """Adam's moments' shardings: the parameters' (`params`), or with `optimizer_over_data`
    cut over the data-parallel axes too (`zero.optimizer_axes`)."""
    if not train.optimizer_over_data:
        return params
    sizes, data = dict(roles.sizes), roles.data_parallel_axes()
    return {
        k: NamedSharding(mesh, P(*optimizer_axes(roles.mesh_axes(axes), s, sizes, data)))
        for k, (s, axes) in shapes.items()
    }


def adam(
    params: Params, opt: Params, grads: Params, *, train: TrainSpec, moments: Params,
    shardings: Params,
) -> tuple[Params, Params]:  # fmt: skip
    """One Adam step: the new parameters and optimizer state. Under ZeRO-1 the update runs on
    each device's part of the moments (the gradients reduce-scattered there, the parameters
    sliced there: `moments`) and the updated parameters are gathered back to `shardings`."""
    count = opt["count"] + 1
    b1, b2 = _BETAS
    odt = jnp.dtype(train.opt_state_dtype)
    zero1 = train.optimizer_over_data

    def part(k: str, a: jax.Array) -> jax.Array:
        return jax.lax.with_sharding_constraint(a, moments[k]) if zero1 else a

    grads = {k: part(k, g) for k, g in grads.items()}
    m = {k: (b1 * opt["m"][k] + (1 - b1) * g).astype(odt) for k, g in grads.items()}
    v = {k: (b2 * opt["v"][k] + (1 - b2) * g * g).astype(odt) for k, g in grads.items()}
    lr = train.learning_rate * jnp.sqrt(1 - b2**count) / (1 - b1**count)
    new = {
        k: (part(k, p) - lr * m[k] / (jnp.sqrt(v[k]) + _EPS)).astype(p.dtype)
        for k, p in params.items()
    }
    if zero1:
        new = {k: jax.lax.with_sharding_constraint(a, shardings[k]) for k, a in new.items()}
    return new, {"m": m, "v": v, "count": count}
