"""The reference step's decoder layers, pipelined over the `pipeline` axis (docs/design.md section
12; which layers and how they are cut: stages.py).

The layers before the pipelined ones run as the step's layers always do, the pipeline axis
acting as data (the batch split over it too). The pipelined ones run under `jax.shard_map`,
manual over the pipeline axis only: every other axis (fsdp, tensor, expert, sequence) stays
automatic inside a stage, sharded by the same rules as without a pipeline, so a stage's layer
is the step's layer. Stage s holds its chunks (`stages/` weights [repeats, 1, per_chunk, ...]
on the device) and runs one chunk an iteration; activations go from stage to stage by
`jax.lax.ppermute` (a collective-permute on the pipeline axis), whose transpose sends the
gradients back the other way.

The schedule (MaxText's, written again here): the batch is cut into M micro-batches (row i of
it to micro-batch i mod M) and each is one work item per repeat: item i is micro-batch i mod M
at repeat i // M. At iteration t stage s works on item t - s, so an item moves one stage an
iteration; the S - 1 iterations where the first or last stages have no item are the bubble,
computed (on zeros) and thrown away. Circular (repeats R > 1): the last stage's output of item
i comes back round to the first stage, which keeps it in a buffer of M micro-batches until
iteration i + M, where it runs chunk r * S of the next repeat (M >= S, so it has arrived). The
last stage's outputs of the last repeat are the pipeline's result. M * R + S - 1 iterations.

That is `pipeline_schedule` "gpipe": jax's autodiff of the whole loop gives the backward, so
a stage keeps every iteration's inputs. "1f1b" (pipeline_1f1b.py, its timetable timetable.py)
runs forwards and backwards in one loop with the loss, keeping the micro-batches in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .cycle import LayerFor, run_layers
from .spec import ModelSpec
from .stages import STAGED, Stages

Params = dict[str, Any]
Layer = Callable[[jax.Array, Params], tuple[jax.Array, Any]]
PICKED = "stage_weights"  # a pipelined layer's weights picked from its stage's chunks
_ALL_BUT_PICKED = jax.checkpoint_policies.save_anything_except_these_names(PICKED)


def to_stages(params: Params, st: Stages) -> Params:
    """Parameters in the layout of `layout.param_shapes` (one stack a kind) in the step's
    stage layout (`stages.staged_shapes`); works on jax and numpy arrays."""
    out = {}
    prefix = st.stack + "/"
    for name, v in params.items():
        if not name.startswith(prefix):
            out[name] = v
            continue
        if st.lead:
            out[name] = v[: st.lead]
        piped = v[st.lead :]
        out[STAGED + name.removeprefix(prefix)] = piped.reshape(
            st.repeats, st.stages, st.per_chunk, *piped.shape[1:]
        )
    return out


def from_stages(params: Params, st: Stages) -> Params:
    """`to_stages` undone: the stage layout back in the layout of `layout.param_shapes`."""
    out = {k: v for k, v in params.items() if not k.startswith((STAGED, st.stack + "/"))}
    for name, v in params.items():
        if name.startswith(STAGED):
            stack = f"{st.stack}/{name.removeprefix(STAGED)}"
            piped = v.reshape(st.layers, *v.shape[3:])
            out[stack] = jnp.concatenate([params[stack], piped]) if st.lead else piped
    return out


def decoder(
    x: jax.Array,
    params: Params,
    *,
    model: ModelSpec,
    stages: Stages | None,
    layer: LayerFor,
    stage_layer: Layer,
    policy: Any,
    mesh: Mesh,
    act: NamedSharding,
    stage_act: NamedSharding,
) -> jax.Array:
    """The decoder layers on the residual stream `x` [batch, seq, d_model]: `layer(window)`
    (the step's, checkpointed, the batch over the pipeline axis too, its activations `act`)
    over the layers that are not pipelined (cycle.py), then, with `stages`, `stage_layer` (the
    step's layer with the roles of a stage, whose activations are `stage_act`, not
    checkpointed yet: the schedule checkpoints it under `policy`, remat.stage_policy's) over
    the pipelined ones."""
    if stages is None:
        return run_layers(layer, x, params, model)
    x = leading(layer, x, params, model=model, stages=stages)
    out = _pipelined(stage_layer, policy, x, staged(params), st=stages, mesh=mesh, act=stage_act)
    return jax.lax.with_sharding_constraint(out, act)


def leading(
    layer: LayerFor, x: jax.Array, params: Params, *, model: ModelSpec, stages: Stages
) -> Any:
    """`layer(window)` over the layers before the pipelined ones (none: `x` as it is)."""
    lead = stages.lead_dense + stages.lead_moe
    return run_layers(layer, x, params, model, count=lead) if lead else x


def staged(params: Params) -> Params:
    """The pipelined layers' weights [R, S, per_chunk, ...], by their names in a layer."""
    return {k.removeprefix(STAGED): v for k, v in params.items() if k.startswith(STAGED)}


def _pipelined(
    layer: Layer,
    policy: Any,
    x: jax.Array,
    weights: Params,
    *,
    st: Stages,
    mesh: Mesh,
    act: NamedSharding,
) -> jax.Array:
    """The pipelined layers on `x` [batch, seq, d_model] (weights [R, S, per_chunk, ...]):
    cut into micro-batches, each device keeping its rows (as the step's gradient accumulation
    does), run through the schedule, put back together."""
    m, rows = st.microbatches, x.shape[0]
    xs = jnp.moveaxis(x.reshape(rows // m, m, *x.shape[1:]), 1, 0)
    # Every stage gets the micro-batches (only the first reads them): gathered over the
    # pipeline axis, each still split over the stage's batch axes.
    xs = jax.lax.with_sharding_constraint(xs, NamedSharding(mesh, P(None, *act.spec)))
    run = jax.shard_map(
        partial(_schedule, dtype=x.dtype, layer=layer, policy=policy, st=st),
        mesh=mesh,
        in_specs=(P(), P(None, st.axis)),
        out_specs=P(st.axis),
        axis_names=frozenset({st.axis}),
        # The MoE block inside runs unchecked (moe.py); its cotangents are summed as the
        # specs say: the micro-batches' over the stages (only the first's are not zero).
        check_vma=False,
    )
    # float32 across the shard_map's edge (exact for bfloat16): XLA:CPU in jax 0.10.2 aborts
    # ("Invalid binary instruction opcode copy") compiling the gradient of a partly manual
    # shard_map whose inputs or outputs are bfloat16 (the stages still send the compute dtype)
    out = run(xs.astype(jnp.float32), weights)
    out = out[st.stages - 1].astype(x.dtype)  # the last stage's results
    return jnp.moveaxis(out, 0, 1).reshape(x.shape)


def _schedule(
    xs: jax.Array, weights: Params, *, dtype: Any, layer: Layer, policy: Any, st: Stages
) -> jax.Array:
    """One stage's part of the schedule (module docstring): `xs` the micro-batches
    [M, rows, seq, d_model] (float32 across the edge; kept, computed and sent in `dtype`),
    `weights` this stage's chunks [R, 1, per_chunk, ...], `layer` checkpointed here under
    `policy`: each layer, or each iteration's chunk as one (`st.remat` "iteration"). Returns
    [1, M, ...] (float32): the pipeline's results on the last stage (zeros elsewhere)."""
    S, R, M, axis = st.stages, st.repeats, st.microbatches, st.axis
    stage = jax.lax.axis_index(axis)
    chunks = {k: v[:, 0] for k, v in weights.items()}
    # GPipe sends from each stage to the next; the circular schedule from the last to the
    # first too.
    ring = [(s, (s + 1) % S) for s in range(S)] if R > 1 else [(s, s + 1) for s in range(S - 1)]

    def chunk(x: jax.Array, r: jax.Array) -> jax.Array:
        # Layer i of chunk r picks its weights inside the layer's checkpoint, which does not
        # save them (no remat policy saves a slice): picked outside, they would be its
        # inputs, which the backward pass keeps for every layer of every iteration (5 GB a
        # device in float32 for LLaMA-3 8B on 2 stages x fsdp 8, on GPU). Without a policy
        # (remat "none": all but the picked weights saved) the layer's compute-dtype casts of
        # them are still kept every iteration.
        def one(x: jax.Array, i: jax.Array) -> tuple[jax.Array, Any]:
            return layer(x, {k: checkpoint_name(v[r, i], PICKED) for k, v in chunks.items()})

        def layers(x: jax.Array) -> jax.Array:
            for i in range(st.per_chunk):
                x = one(x, jnp.asarray(i))[0]
            return x

        if st.remat == "iteration":  # one checkpoint, as MaxText's
            return jax.checkpoint(layers, policy=policy)(x)
        run = jax.checkpoint(one, policy=policy or _ALL_BUT_PICKED)
        return jax.lax.scan(run, x, jnp.arange(st.per_chunk))[0]

    def iteration(carry: tuple[jax.Array, ...], t: jax.Array) -> tuple[Any, None]:
        buffer, received, out = carry
        if R > 1:  # what the last stage sent last iteration, item t - S, waits on the first
            back = (t - S) % M
            keep = (stage == 0) & (t >= S)
            buffer = _put(buffer, jnp.where(keep, received, _get(buffer, back)), back)
        item = t - stage
        x = jnp.where(stage == 0, _get(buffer, t % M).astype(dtype), received)
        y = chunk(x, jnp.clip(item // M, 0, R - 1))
        slot = item % M
        done = (stage == S - 1) & (item >= (R - 1) * M) & (item < R * M)
        out = _put(out, jnp.where(done, y.astype(out.dtype), _get(out, slot)), slot)
        return (buffer, jax.lax.ppermute(y, axis, ring), out), None

    buffer = xs.astype(dtype)
    carry = (buffer, jnp.zeros(xs.shape[1:], dtype), jnp.zeros_like(buffer))
    (_, _, out), _ = jax.lax.scan(iteration, carry, jnp.arange(st.iterations))
    return out[None].astype(xs.dtype)


def _get(a: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def _put(a: jax.Array, value: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(a, value, i, 0)
