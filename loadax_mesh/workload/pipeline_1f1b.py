"""The pipelined layers and the loss under the 1F1B schedule (TrainSpec.pipeline_schedule
"1f1b"; the timetable and what a stage holds: timetable.py).

A stage cannot start a micro-batch's backward until the loss of that micro-batch is known, so
the schedule takes the head too, in the tick the last stage's forward of a micro-batch ends:
its output is summed to every stage, each stage computes the final norm, its slice of the
vocabulary's logits and the loss (loss.py `VocabSplit`), the output's gradient is summed back,
and the last stage's backward starts there. Every stage computing the whole head would cost
S times GPipe's head work on every device; cut by vocabulary it costs GPipe's. One
`jax.custom_vjp` wraps it all: its forward runs the whole schedule under `jax.shard_map` (manual
over the pipeline axis only, as GPipe's: every other axis automatic inside a stage) and returns
the loss with the gradients of everything it read (the pipeline's input, the stages' weights,
the head's weights) as residuals; its backward returns them times the loss's cotangent.

A tick's forward slot runs its chunk's layers and keeps their inputs (pipeline_remat "layer")
or the chunk's input alone ("iteration") in a buffer of the micro-batches in flight; the
backward slot takes a micro-batch's kept inputs and the gradient of its output, and runs the
vjp of each layer (of the whole chunk for "iteration"), last first: each layer recomputed
once from its input, as GPipe's backward under full remat, whatever the remat policy (the
policy's saved tensors would be kept only from a layer's recompute to its backward, within one
slot). Weight gradients are summed over micro-batches in float32 in the chunks' layout.
Activations go to the next stage and gradients to the one before by `jax.lax.ppermute` (with
repeats round the ring both ways). A slot with no work runs on what it holds and its results
are thrown away (its gradient seed is zero, so its weight gradients are exact zeros).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .loss import VocabSplit
from .stages import Stages
from .timetable import Timetable, one_f_one_b

Params = dict[str, Any]
Layer = Callable[[jax.Array, Params], tuple[jax.Array, Any]]
# The loss of one micro-batch: (the last stage's output, the head's weights, its targets, the
# vocabulary's cut).
Head = Callable[[jax.Array, Params, jax.Array, VocabSplit], jax.Array]


def pipelined_loss(
    x: jax.Array,
    targets: jax.Array,
    weights: Params,
    head: Params,
    *,
    st: Stages,
    mesh: Mesh,
    act: NamedSharding,
    layer: Layer,
    loss: Head,
    table: tuple[str, int],
    shardings: tuple[dict[str, NamedSharding], dict[str, NamedSharding]],
) -> jax.Array:
    """The mean loss of the batch: `x` [batch, seq, d_model] the residual stream into the
    pipelined layers (`weights` [R, S, per_chunk, ...] by name), `targets` [batch, seq], `head`
    the weights `loss` reads, `table` the name of the one of them that holds the vocabulary and
    its vocabulary dim; `layer` and `loss` a stage's (activations in `act`), `shardings` the
    step's of `weights` and of `head`. Each device keeps its rows, row i to micro-batch
    i mod M."""
    m, rows = st.microbatches, x.shape[0]
    xs = jnp.moveaxis(x.reshape(rows // m, m, *x.shape[1:]), 1, 0)
    ts = jnp.moveaxis(targets.reshape(rows // m, m, *targets.shape[1:]), 1, 0)
    # every stage gets the micro-batches and their targets (the first reads the one, the last
    # the other), each split over the stage's batch axes
    xs = jax.lax.with_sharding_constraint(xs, NamedSharding(mesh, P(None, *act.spec)))
    ts = jax.lax.with_sharding_constraint(ts, NamedSharding(mesh, P(None, *act.spec[:2])))
    inside = [
        {k: NamedSharding(mesh, _drop(s.spec, st.axis)) for k, s in group.items()}
        for group in shardings
    ]
    specs = (inside[0], inside[1])
    # the table cut over the stages by vocabulary, padded to a multiple of them
    name, dim = table
    vocab = head[name].shape[dim]
    pad = [(0, 0)] * head[name].ndim
    pad[dim] = (0, -vocab % st.stages)
    head = {**head, name: jnp.pad(head[name], pad)}
    cut = {k: P(*[None] * dim, st.axis) if k == name else P() for k in head}
    tt = one_f_one_b(st.stages, st.repeats, m)
    body = partial(
        _schedule, tt=tt, st=st, layer=layer, loss=loss, specs=specs, table=table, vocab=vocab
    )
    run = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P(None, st.axis), cut, P()),
        out_specs=(P(), P(st.axis), P(None, st.axis), cut),
        axis_names=frozenset({st.axis}),
        check_vma=False,  # as GPipe's: the MoE block inside runs unchecked (moe.py)
    )

    @jax.custom_vjp
    def scheduled(xs: jax.Array, weights: Params, head: Params, ts: jax.Array) -> jax.Array:
        return run(xs, weights, head, ts)[0]

    def forward(xs: jax.Array, weights: Params, head: Params, ts: jax.Array) -> Any:
        total, dxs, dweights, dhead = run(xs, weights, head, ts)
        return total, (dxs[0], dweights, dhead)

    def backward(grads: Any, g: jax.Array) -> Any:
        scaled = jax.tree.map(lambda a: (a * g).astype(a.dtype), grads)
        return (*scaled, None)

    scheduled.defvjp(forward, backward)
    return scheduled(xs, weights, head, ts)


def _drop(spec: P, axis: str) -> P:
    """`spec` inside a stage: the stage dim of a pipelined weight gone, no entry naming
    the pipeline axis (the other weights name none)."""
    entries = list(spec)
    if axis in entries:
        entries.pop(entries.index(axis))
    return P(*entries)


def _schedule(
    xs: jax.Array,
    weights: Params,
    head: Params,
    ts: jax.Array,
    *,
    tt: Timetable,
    st: Stages,
    layer: Layer,
    loss: Head,
    specs: tuple[dict[str, NamedSharding], dict[str, NamedSharding]],
    table: tuple[str, int],
    vocab: int,
) -> tuple[jax.Array, jax.Array, Params, Params]:
    """One stage's part of the 1F1B schedule: `xs` [M, rows, seq, d_model] the micro-batches,
    `weights` this stage's chunks [R, 1, per_chunk, ...], `head` the head's weights (this
    stage's slice of the `table`), `ts` the targets [M, rows, seq]. Returns the loss (the last
    stage's), the gradients of `xs` ([1, M, ...]: the first stage's), of the chunks
    ([R, 1, ...]) and of the head (the table's slice; the rest summed over the stages)."""
    S, R, M, axis = st.stages, st.repeats, st.microbatches, st.axis
    dtype, (wspecs, hspecs) = xs.dtype, specs
    stage = jax.lax.axis_index(axis)
    chunks = {k: v[:, 0] for k, v in weights.items()}
    keep_layers = st.remat == "layer"
    trash = tt.slots  # where a forward slot with no work writes what it would keep
    forward_table, backward_table = (_table(t, trash) for t in (tt.forward, tt.backward))
    ahead = [(s, (s + 1) % S) for s in range(S)] if R > 1 else [(s, s + 1) for s in range(S - 1)]
    back = [(b, a) for a, b in ahead]

    def pick(r: jax.Array, i: jax.Array | None = None) -> Params:
        return {k: v[r] if i is None else v[r, i] for k, v in chunks.items()}

    def run_chunk(x: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array]:
        def one(x: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
            return layer(x, pick(r, i))[0], x

        y, inputs = jax.lax.scan(one, x, jnp.arange(st.per_chunk))
        return y, inputs if keep_layers else x

    def chunk_backward(kept: jax.Array, dy: jax.Array, r: jax.Array, acc: Params) -> Any:
        if not keep_layers:  # the chunk at once: all its layers' intermediates held

            def chunk(x: jax.Array, w: Params) -> jax.Array:
                return jax.lax.scan(lambda x, wi: (layer(x, wi)[0], None), x, w)[0]

            dx, dw = jax.vjp(chunk, kept, pick(r))[1](dy)
            return dx, {k: _add(acc[k], dw[k], (r,), wspecs[k]) for k in acc}

        def one(carry: tuple[jax.Array, Params], xi: Any) -> tuple[Any, None]:
            dy, acc = carry
            x, i = xi
            dx, dw = jax.vjp(lambda x, w: layer(x, w)[0], x, pick(r, i))[1](dy)
            return (dx, {k: _add(acc[k], dw[k], (r, i), wspecs[k]) for k in acc}), None

        (dx, acc), _ = jax.lax.scan(one, (dy, acc), (kept, jnp.arange(st.per_chunk)), reverse=True)
        return dx, acc

    split = VocabSplit(axis, stage * head[table[0]].shape[table[1]], vocab)

    def head_slot(y: jax.Array, micro: jax.Array, ends: jax.Array) -> Any:
        # float32 sums: XLA:CPU's all-reduce promotion refuses a bfloat16 one
        y = _sum(y * (stage == S - 1).astype(y.dtype), axis)
        value, pull = jax.vjp(lambda y, h: loss(y, h, _get(ts, micro), split), y, head)
        dy, dh = pull(jnp.where(ends, 1.0 / M, 0.0).astype(value.dtype))
        return jnp.where(ends & (stage == S - 1), value, 0.0), _sum(dy, axis), dh

    def no_head(y: jax.Array, micro: jax.Array, ends: jax.Array) -> Any:
        zeros = {k: jnp.zeros(v.shape, v.dtype) for k, v in head.items()}
        return jnp.zeros((), jnp.float32), jnp.zeros(y.shape, y.dtype), zeros

    def tick(
        carry: dict[str, Any], row: Any, *, fwd: bool, bwd: bool, heads: str
    ) -> tuple[Any, None]:
        c: dict[str, Any] = dict(carry)
        f, b, ends = row
        dy_head = None
        if fwd:
            _, micro, r, slot = (f[stage, j] for j in range(4))
            first = (stage == 0) & (r == 0)
            x = jnp.where(first, _get(xs, micro), c["from_before"])
            y, kept = run_chunk(x, r)
            c["kept"] = _put(c["kept"], kept, slot)
            if heads != "none":  # the last stage's micro-batch, alike on every stage
                last = f[S - 1, 1]
                if heads == "always":
                    value, dy_head, dh = head_slot(y, last, ends)
                else:  # only the ticks that end one
                    value, dy_head, dh = jax.lax.cond(ends, head_slot, no_head, y, last, ends)
                c["loss"] = c["loss"] + value
                c["dhead"] = {
                    k: _constrain(c["dhead"][k] + dh[k].astype(jnp.float32), hspecs[k])
                    for k in head
                }
            c["from_before"] = jax.lax.ppermute(y, axis, ahead)
        if bwd:
            runs, micro, r, slot = (b[stage, j] for j in range(4))
            runs = runs == 1
            dy = c["from_after"]
            if dy_head is not None:  # the last chunk's output: its gradient from the head
                dy = jnp.where((stage == S - 1) & (r == R - 1), dy_head, dy)
            dy = jnp.where(runs, dy, jnp.zeros_like(dy))
            dx, c["acc"] = chunk_backward(_get(c["kept"], slot), dy, r, c["acc"])
            into = runs & (stage == 0) & (r == 0)
            c["dxs"] = _put(c["dxs"], jnp.where(into, dx, _get(c["dxs"], micro)), micro)
            c["from_after"] = jax.lax.ppermute(dx, axis, back)
        return c, None

    one = xs.shape[1:]
    kept_shape = (tt.slots + 1, *((st.per_chunk,) if keep_layers else ()), *one)
    carry: dict[str, Any] = {
        "kept": jnp.zeros(kept_shape, dtype),
        "from_before": jnp.zeros(one, dtype),
        "from_after": jnp.zeros(one, dtype),
        "acc": {
            k: _constrain(jnp.zeros(v.shape, jnp.float32), wspecs[k]) for k, v in chunks.items()
        },
        "dxs": jnp.zeros_like(xs),
        "loss": jnp.zeros((), jnp.float32),
        "dhead": {
            k: _constrain(jnp.zeros(v.shape, jnp.float32), hspecs[k]) for k, v in head.items()
        },
    }
    rows = (forward_table, backward_table, _heads(tt, R))
    start = 0
    # No micro-batch ends before the steady loop; in it one ends every tick at R = 1, every
    # S of R S ticks at R > 1. Each loop under its own name: the program's collectives (a
    # permute traced once a loop) are then told apart by their origin (compiler/hlo.py).
    for name, ticks, fwd, bwd, heads in (
        ("warmup", tt.warmup, True, False, "none"),
        ("steady", tt.steady, True, True, "always" if R == 1 else "cond"),
        ("cooldown", tt.cooldown, False, True, "none"),
    ):
        part = jax.tree.map(lambda a, s=start, n=ticks: a[s : s + n], rows)
        with jax.named_scope(f"1f1b_{name}"):
            loop = partial(tick, fwd=fwd, bwd=bwd, heads=heads)
            carry, _ = jax.lax.scan(loop, carry, part)
        start += ticks
    total = jax.lax.psum(carry["loss"], axis) / M
    dhead = {
        k: (g if k == table[0] else jax.lax.psum(g, axis)).astype(head[k].dtype)
        for k, g in carry["dhead"].items()
    }
    dweights = {k: g[:, None].astype(weights[k].dtype) for k, g in carry["acc"].items()}
    return total, carry["dxs"][None], dweights, dhead


def _table(slots: tuple[tuple[Any, ...], ...], trash: int) -> jax.Array:
    """A timetable's slots [ticks, stages, 4] (runs, micro-batch, repeat, buffer slot) as
    int32, a slot with no work sent to the buffer's `trash` slot."""
    a = np.array(slots, dtype=np.int32)
    a[..., 3] = np.where(a[..., 0] == 1, a[..., 3], trash)
    return jnp.asarray(a)


def _heads(tt: Timetable, repeats: int) -> jax.Array:
    """Per tick: whether the last stage ends a micro-batch's last chunk (runs the head)."""
    return jnp.asarray([row[-1][0] and row[-1][2] == repeats - 1 for row in tt.forward])


def _constrain(a: jax.Array, sharding: NamedSharding) -> jax.Array:
    return jax.lax.with_sharding_constraint(a, sharding)


def _add(acc: jax.Array, g: jax.Array, at: tuple[jax.Array, ...], sharding: Any) -> jax.Array:
    """`acc` with `g` (float32) added at the leading index `at` (a repeat, or a repeat and a
    layer of the chunk)."""
    index: tuple[Any, ...] = (*at, *([0] * g.ndim))
    size = (*([1] * len(at)), *g.shape)
    old = jax.lax.dynamic_slice(acc, index, size)
    new = old + g.astype(jnp.float32).reshape(size)
    return _constrain(jax.lax.dynamic_update_slice(acc, new, index), sharding)


def _sum(a: jax.Array, axis: str) -> jax.Array:
    return jax.lax.psum(a.astype(jnp.float32), axis).astype(a.dtype)


def _get(a: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def _put(a: jax.Array, value: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(a, value, i, 0)
