"""Mixture-of-experts layers of the reference step (docs/design.md section 11): the MoE block
(router, top-k, dispatch, experts, combine); the order of dense and MoE layers is cycle.py's.

The block runs under `shard_map` over the whole mesh, each device routing its own tokens: a
float32 router, the top `experts_per_token` (or, under `routing="balanced"`, token i to experts
(i k + j) mod E, as benchmark runs force balanced load), the copies sorted by expert. Then
`moe="dropless"` computes every copy as grouped matmuls (`kernels.grouped_matmul`), exchanged
over an expert axis in fixed-size blocks a peer (dispatch.py); `moe="capacity"` keeps at most
ceil(tokens k / E x capacity_factor) copies an expert from each device in [E, capacity, d_model]
slots, batched matmuls over experts, all-to-all both ways. The experts' weights are sharded over
fsdp by their d_model and gathered inside the block; the tensor axis splits their width, and
their output is reduce-scattered into the residual stream's layout. Shared experts are a dense
SwiGLU MLP beside the routed ones. Why each choice, and what MaxText runs: docs/cost-terms.md,
"The MoE block".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from . import quantized
from .dispatch import peer_rows, token_runs
from .kernels import GroupedMatmul, grouped_matmul, shard_map_mesh
from .layout import Roles
from .spec import ModelSpec, TrainSpec

Params = dict[str, Any]


def moe_mlp(
    h: jax.Array,
    p: Params,
    *,
    mesh: Mesh,
    roles: Roles,
    model: ModelSpec,
    train: TrainSpec,
    positions: Any = None,
) -> jax.Array:
    """The MoE block's output for the normed residual `h` [batch, seq, d_model]: the routed
    experts' weighted sum (in the residual stream's sharding, d_model over the tensor axis),
    plus the shared experts'. `positions`: each token slot's position in the sequence (the
    step's order, context.py; None: the sequence's own), which balanced routing reads."""
    cdt = h.dtype
    ep = roles.size("expert")
    exp = roles.expert if ep > 1 else None
    mlp = roles.model if roles.size("model") > 1 else None
    batch = roles.mesh_axes(("batch",))[0]
    tokens = P(batch, roles.seq, None)
    out = P(batch, roles.seq, mlp)
    # The weights come in as they are stored, and are gathered inside (their gradients leave
    # reduce-scattered): the router's d_model, and the experts' d_model over fsdp. Their specs
    # name only axes that `out` names (`_within`): any other would leave the output varying
    # over an axis `out` says it is replicated over.
    router = _within(roles.mesh_axes(("embed", None)), out)
    w_in = _within(roles.mesh_axes(("exp", "embed_no_exp", "mlp")), out)
    w_out = _within(roles.mesh_axes(("exp", "mlp", "embed_no_exp")), out)
    gathers = (router[0], w_in[1])
    local = partial(
        _local,
        model=model,
        train=train,
        ep=ep,
        axes=(exp, mlp, roles.batch, roles.seq),
        gathers=gathers,
        positions=positions,
        matmul=grouped_matmul(mesh.devices.flat[0].platform, train.quantization),
    )
    routed = jax.shard_map(
        local,
        **shard_map_mesh(mesh),  # inside a pipeline stage too
        in_specs=(tokens, P(*router), P(*w_in), P(*w_in), P(*w_out)),
        out_specs=out,
        # Pallas kernels (tokamax's on GPU) give their results no varying-axes type, which a
        # checked custom VJP refuses; unchecked, every input's cotangent is summed over the
        # axes its spec leaves out, what the block's partial sums need (the 8-device tests),
        # and `_within` keeps the specs what a checked trace would accept.
        check_vma=False,
    )(h, *(p[w].astype(cdt) for w in ("router", "we_gate", "we_up", "we_down")))
    if not model.num_shared_experts:
        return routed
    mm = partial(quantized.einsum, quantization=train.quantization)
    gate, up = mm("bsd,df->bsf", h, p["ws_gate"]), mm("bsd,df->bsf", h, p["ws_up"])
    return routed + mm("bsf,fd->bsd", jax.nn.silu(gate) * up, p["ws_down"])


def _within(spec: tuple[Any, ...], out: P) -> tuple[Any, ...]:
    """`spec`'s entries less the mesh axes `out` does not name (an entry left with none: None).

    Under `shard_map` (jax's `check_vma`) an input varies over every axis its in_spec names,
    size 1 included, and so does what the body computes from it, unless a collective reduces
    over that axis; an out_spec that leaves such an axis out then claims a replication jax
    cannot infer. The block reduces over the tensor axis only, into `out`; an axis of a
    weight's spec that `out` does not name (the tensor or expert axis at size 1, or an fsdp
    axis that does not split the batch) the weight arrives whole over, gathered outside."""
    named = {a for entry in out for a in ((entry,) if isinstance(entry, str) else entry or ())}
    kept = []
    for entry in spec:
        axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a in named)
        kept.append(axes[0] if len(axes) == 1 else (axes or None))
    return tuple(kept)


def _local(
    x: jax.Array,
    router: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    *,
    model: ModelSpec,
    train: TrainSpec,
    ep: int,
    axes: tuple[str | None, str | None, tuple[str, ...], str | None],
    gathers: tuple[Any, Any],
    positions: Any,
    matmul: GroupedMatmul,
) -> jax.Array:
    """One device's share of the block: its tokens [b, s, d] routed, dispatched, computed by
    the experts and combined; partial over the tensor axis until reduce-scattered. `gathers`:
    the mesh axes over which the router's d_model and the experts' d_model are gathered;
    `matmul` the platform's grouped matmul (dropless)."""
    exp, mlp, batch_axes, seq = axes
    by_router, by_d = gathers
    router = _gather(router, by_router, 0)
    w_gate, w_up = (_gather(w, by_d, 1) for w in (w_gate, w_up))
    w_down = _gather(w_down, by_d, 2)
    b, s, d = x.shape
    k, n = model.experts_per_token, model.num_experts
    flat_x = x.reshape(b * s, d)
    experts, weights = _route(
        flat_x, router, model, train, _balanced(b, s, batch_axes, seq, k, n, positions)
    )
    # Token copies sorted by expert (stable: each expert's copies in token order).
    copies = experts.reshape(-1)
    order = jnp.argsort(copies, stable=True)
    sorted_experts = copies[order]
    xs = flat_x[order // k]
    w = (w_gate, w_up, w_down)
    if train.moe == "dropless":
        runs = token_runs(b, seq_split=s != model.seq_len, load_balanced=positions is not None)
        per_peer = peer_rows(b * s, k, n, ep, routing=train.routing, runs=runs)
        out = _dropless(xs, sorted_experts, w, n, ep, exp, per_peer, matmul)
    else:
        cap = math.ceil(b * s * k / n * train.capacity_factor)
        out = _capacity(xs, sorted_experts, w, n, ep, exp, cap, train.quantization)
    out = out[_inverse(order)].reshape(b * s, k, d)
    weights = weights * model.routed_scaling
    y = jnp.einsum("tkd,tk->td", out, weights.astype(x.dtype)).reshape(b, s, d)
    if mlp is not None:
        y = jax.lax.psum_scatter(y, mlp, scatter_dimension=2, tiled=True)
    return y


def _gather(w: jax.Array, axes: Any, dim: int) -> jax.Array:
    """`w` whole along `dim` over `axes` (a mesh axis, a tuple of them, or None: as it is)."""
    return w if not axes else jax.lax.all_gather(w, axes, axis=dim, tiled=True)


def _balanced(
    b: int,
    s: int,
    batch_axes: tuple[str, ...],
    seq: str | None,
    k: int,
    n: int,
    positions: Any,
) -> Callable[[], jax.Array]:
    """The balanced experts of this device's tokens [b * s, k]: ((global index) * k + j) mod
    E, the global index row-major over the whole batch (this device's block found by its
    position on the batch and sequence axes; a token's column its position in the sequence,
    `positions` of its slot under the load-balanced order)."""

    def experts() -> jax.Array:
        row0 = jax.lax.axis_index(batch_axes) * b
        col0 = jax.lax.axis_index(seq) * s if seq is not None else 0
        total_seq = s * (jax.lax.axis_size(seq) if seq is not None else 1)
        rows = row0 + jnp.arange(b)[:, None]
        cols = col0 + jnp.arange(s)[None, :]
        if positions is not None:
            cols = jnp.asarray(positions)[cols]
        index = (rows * total_seq + cols).reshape(-1, 1)
        return ((index * k + jnp.arange(k)[None, :]) % n).astype(jnp.int32)

    return experts


def _route(
    x: jax.Array,
    router: jax.Array,
    model: ModelSpec,
    train: TrainSpec,
    balanced: Callable[[], jax.Array],
) -> tuple[jax.Array, jax.Array]:
    """Each token's experts [t, k] (int32) and their weights [t, k] (float32)."""
    logits = jnp.einsum("td,de->te", x.astype(jnp.float32), router.astype(jnp.float32))
    k = model.experts_per_token
    if model.router == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
    if train.routing == "learned":
        weights, experts = jax.lax.top_k(scores, k)
    else:
        experts = balanced()
        weights = jnp.take_along_axis(scores, experts, axis=-1)
    if model.router == "softmax" or k > 1:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return experts.astype(jnp.int32), weights


def _inverse(order: jax.Array) -> jax.Array:
    """The permutation that undoes `order`."""
    return jnp.zeros_like(order).at[order].set(jnp.arange(order.size, dtype=order.dtype))


def _counts(ids: jax.Array, n: int) -> jax.Array:
    """How many of the sorted `ids` are each of 0..n-1 (others not counted), int32: by binary
    search, not a scatter (which libtpu moves to the SparseCore)."""
    edges = jnp.searchsorted(ids, jnp.arange(n + 1, dtype=ids.dtype))
    return jnp.diff(edges).astype(jnp.int32)


def _grouped(
    xs: jax.Array, sizes: jax.Array, w: tuple[jax.Array, ...], matmul: GroupedMatmul
) -> jax.Array:
    """SwiGLU experts over rows grouped by expert (`sizes` rows each, in expert order)."""
    w_gate, w_up, w_down = w
    gate = matmul(xs, w_gate, sizes)
    up = matmul(xs, w_up, sizes)
    return matmul(jax.nn.silu(gate) * up, w_down, sizes)


def _dropless(
    xs: jax.Array,
    experts: jax.Array,
    w: tuple[jax.Array, ...],
    n: int,
    ep: int,
    exp: str | None,
    per_peer: int,
    matmul: GroupedMatmul,
) -> jax.Array:
    """Every sorted copy through its expert as grouped matmuls; across the expert axis, the
    copies for each peer in a block of `per_peer` rows (the worst case), exchanged by
    all-to-all, regrouped by local expert (padding last, in no group) and sent back."""
    if exp is None:
        return _grouped(xs, _counts(experts, n), w, matmul)
    local = n // ep
    dest = experts // local
    counts = _counts(dest, ep)
    slot = dest * per_peer + jnp.arange(xs.shape[0]) - (jnp.cumsum(counts) - counts)[dest]
    send = jnp.zeros((ep * per_peer, xs.shape[1]), xs.dtype).at[slot].set(xs)
    ids = jnp.full((ep * per_peer,), local, jnp.int32).at[slot].set(experts % local)
    recv, recv_ids = _exchange(send, exp, ep), _exchange(ids, exp, ep)
    order = jnp.argsort(recv_ids, stable=True)
    out = _grouped(recv[order], _counts(recv_ids[order], local), w, matmul)[_inverse(order)]
    return _exchange(out, exp, ep)[slot]


def _capacity(
    xs: jax.Array,
    experts: jax.Array,
    w: tuple[jax.Array, ...],
    n: int,
    ep: int,
    exp: str | None,
    cap: int,
    quantization: str,
) -> jax.Array:
    """Sorted copies into [E, cap] slots (the overflow dropped), the experts as batched
    matmuls (in `quantization`'s precision), the slots exchanged over the expert axis both
    ways; a dropped copy gives zero."""
    rows, d = xs.shape
    counts = _counts(experts, n)
    position = jnp.arange(rows) - (jnp.cumsum(counts) - counts)[experts]
    slot = jnp.where(position < cap, experts * cap + position, n * cap)  # n * cap: dropped
    slots = jnp.zeros((n * cap, d), xs.dtype).at[slot].set(xs, mode="drop")
    local = n // ep
    if exp is not None:  # blocks by sender, each [local, cap]: regrouped by local expert
        slots = _exchange(slots, exp, ep).reshape(ep, local, cap, d).transpose(1, 0, 2, 3)
    w_gate, w_up, w_down = w
    slots = slots.reshape(local, ep * cap, d)
    mm = partial(quantized.einsum, quantization=quantization)
    gate, up = mm("ecd,edf->ecf", slots, w_gate), mm("ecd,edf->ecf", slots, w_up)
    out = mm("ecf,efd->ecd", jax.nn.silu(gate) * up, w_down)
    if exp is not None:
        out = _exchange(out.reshape(local, ep, cap, d).transpose(1, 0, 2, 3), exp, ep)
    return out.reshape(n * cap, d).at[slot].get(mode="fill", fill_value=0)


def _exchange(a: jax.Array, axis: str, ep: int) -> jax.Array:
    """Block i of `a` (split on its leading dim) to the device at position i on `axis`; the
    result holds the blocks received, in senders' order."""
    blocks = a.reshape(ep, a.shape[0] // ep, *a.shape[1:])
    return jax.lax.all_to_all(blocks, axis, 0, 0).reshape(a.shape)
