"""The MoE layers' terms of the cost model, counted from the reference step (workload/moe.py).

Per MoE layer and micro-batch, one device routes its own `t` tokens (its rows times its slice
of the sequence; the tensor axis's members route the same tokens, each computing 1/m of the
experts' width). What the block holds and moves:
- Dropless without an expert axis: the `t * k` sorted token copies go through all `E` experts
  as grouped matmuls (ragged_dot), each expert's group `t * k / E` rows under even load.
- Dropless over an expert axis of size P: a send buffer of P blocks of the most copies one
  device can send one peer (workload/dispatch.py: `t * min(k, E / P)` rows under learned
  routing, about `t * k / P` under balanced routing) exchanged by all-to-all, with an int32
  expert id a row; the received buffer regrouped by local expert and computed (the padding in
  no group: a local expert's group is its `t * k * P / E` copies); the result exchanged back.
- Capacity: `E` slots of `cap = ceil(t * k / E * capacity_factor)` rows, the padding computed
  as work; over an expert axis the slots exchanged both ways, each local expert then holding
  `P * cap` rows.
The experts' weights, sharded over fsdp by their d_model: each device gathers its E / P experts
over fsdp with an expert axis, all E without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...workload.dispatch import peer_rows, token_runs
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes


@dataclass(frozen=True)
class MoeShapes:
    """One device's sizes in a MoE layer, for one micro-batch."""

    tokens: int  # t: the tokens it routes
    copies: int  # t * k: their copies, sorted by expert
    buffer: int  # rows of a dispatch buffer (send and receive alike), 0 without one
    rows: int  # rows its experts compute (the buffer's, capacity padding included)
    groups: int  # experts it computes (E / P)
    group_rows: int  # rows of one expert's group (even load): the grouped matmul's height
    width: int  # an expert's width on this device (moe_d_ff over the tensor axis)
    ep: int  # the expert axis's size (1 without one)

    @classmethod
    def of(cls, model: ModelSpec, train: TrainSpec, roles: Roles) -> MoeShapes:
        rows = max(1, train.global_batch // roles.size("batch") // train.microbatches)
        t = rows * (model.seq_len // roles.size("seq"))
        k, n, ep = model.experts_per_token, model.num_experts, roles.size("expert")
        local = n // ep
        if train.moe == "capacity":
            cap = math.ceil(t * k / n * train.capacity_factor)
            buffer, computed, group = n * cap, n * cap, ep * cap
        else:
            seq = roles.size("seq") > 1
            runs = token_runs(rows, seq_split=seq, load_balanced=seq and train.context_load_balance)
            buffer = ep * peer_rows(t, k, n, ep, routing=train.routing, runs=runs) if ep > 1 else 0
            computed = buffer or t * k
            group = -(-t * k * ep // n)  # its copies from every peer, even load
        return cls(
            t, t * k, buffer, computed, local, group, model.moe_d_ff // roles.size("model"), ep
        )


def moe_intermediates(
    model: ModelSpec, train: TrainSpec, roles: Roles, r: int, s: int
) -> dict[str, tuple[tuple[int, ...], int]]:
    """One MoE block's intermediates on one device (name -> (shape, bytes per element)), in
    place of a dense layer's MLP: the router's float32 logits and scores; the sorted copies;
    the dispatch buffer sent, received and regrouped (dropless over an expert axis), or the
    capacity slots (and, over an expert axis, the slots received); the experts' gate, up and
    gated product and their output; the output sent back (over an expert axis), the copies
    unsorted, and the weighted sum, d_model whole until reduce-scattered over the tensor
    axis; the shared experts' gate, up and product beside them."""
    cd = dtype_bytes(train.compute_dtype)
    ms = MoeShapes.of(model, train, roles)
    d, e = model.d_model, model.num_experts
    t, rows = ms.tokens, ms.rows
    found: dict[str, tuple[tuple[int, ...], int]] = {
        "router logits": ((t, e), 4),
        "router scores": ((t, e), 4),
        "token copies": ((ms.copies, d), cd),
    }
    if train.moe == "capacity":
        found["capacity slots"] = ((rows, d), cd)
        if ms.ep > 1:
            found["dispatched"] = ((rows, d), cd)
    elif ms.ep > 1:
        found |= {n: ((rows, d), cd) for n in ("dispatch buffer", "dispatched", "regrouped")}
    found |= {n: ((rows, ms.width), cd) for n in ("expert gate", "expert up", "expert gated")}
    found["expert out"] = ((rows, d), cd)
    if ms.ep > 1:
        found["combined"] = ((rows, d), cd)
    found |= {"unsorted copies": ((ms.copies, d), cd), "routed": ((t, d), cd)}
    if model.num_shared_experts:
        width = model.num_shared_experts * model.moe_d_ff // roles.size("model")
        found |= {n: ((r, s, width), cd) for n in ("shared gate", "shared up", "shared gated")}
    return found


def moe_residuals(
    found: dict[str, tuple[tuple[int, ...], int]],
) -> dict[str, tuple[tuple[int, ...], int]]:
    """What autodiff keeps of a MoE block with no checkpoint: every intermediate above (each
    feeds an op that needs it back), and each SwiGLU's sigmoid, its slope and the SiLU, as a
    dense SwiGLU keeps them (saved.residuals)."""
    kept = {n: v for n, v in found.items() if n in MOE_NAMES}
    for prefix in ("expert", "shared"):
        if f"{prefix} gate" in found:
            kept |= {f"{prefix} {n}": found[f"{prefix} gate"] for n in ("sigmoid", "slope", "silu")}
    return kept


MOE_NAMES = (
    "router logits",
    "router scores",
    "token copies",
    "capacity slots",
    "dispatch buffer",
    "dispatched",
    "regrouped",
    "expert gate",
    "expert up",
    "expert gated",
    "expert out",
    "combined",
    "unsorted copies",
    "routed",
    "shared gate",
    "shared up",
    "shared gated",
)


def expert_rows(
    model: ModelSpec, train: TrainSpec, roles: Roles, *, grouped: str
) -> tuple[float, float]:
    """Rows per routed token that the experts' matmuls execute: (the forward's and the input
    gradient's, the weight gradient's). Capacity slots are batched matmuls, padding included.
    Dropless, the grouped matmuls run as the platform runs them (`grouped`, the platform trait
    `grouped_matmul`): "tokamax", a grouped kernel in all three passes over the copies (the
    padding of the worst-case buffer in no group); "libtpu", that for the forward and the input
    gradient, but the weight gradient (grouped by contracted rows) a dense masked matmul over
    every local expert and every row of the buffer (a convolution [E / P, rows] per expert
    weight, docs/notes/2026-11-26-moe-referees-model-scale.md); "dense", every
    pass so."""
    ms = MoeShapes.of(model, train, roles)
    if train.moe == "capacity":
        return ms.rows / ms.tokens, ms.rows / ms.tokens
    dense = ms.groups * ms.rows / ms.tokens
    routed = ms.copies / ms.tokens
    return {"tokamax": (routed, routed), "libtpu": (routed, dense)}.get(grouped, (dense, dense))


def moe_op_flops(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    *,
    executed: bool = True,
    grouped: str = "libtpu",
) -> dict[str, float]:
    """FLOPs per token of a MoE layer's MLP ops (2 per weight and row): the router with the
    experts' input projections (gate and up), and their down projection, over the rows the
    experts compute per token in the forward pass (`executed`: `expert_rows`' first; else the
    model's k copies), plus the shared experts'."""
    ms = MoeShapes.of(model, train, roles)
    d, f = model.d_model, model.moe_d_ff
    per_token = ms.copies / ms.tokens
    if executed:
        per_token = expert_rows(model, train, roles, grouped=grouped)[0]
    shared = model.num_shared_experts * f
    return {
        "mlp_in": 2.0 * d * model.num_experts + 2.0 * 2 * d * (per_token * f + shared),
        "mlp_out": 2.0 * d * (per_token * f + shared),
    }


def exchange_bytes(model: ModelSpec, train: TrainSpec, roles: Roles) -> tuple[int, int]:
    """Bytes of one all-to-all over the expert axis (the whole buffer, as the compiler counts
    it): (a token buffer, the dropless path's int32 expert ids; 0 where it sends none)."""
    ms = MoeShapes.of(model, train, roles)
    cd = dtype_bytes(train.compute_dtype)
    if ms.ep == 1:
        return 0, 0
    return ms.rows * model.d_model * cd, (ms.buffer * 4 if train.moe == "dropless" else 0)


def expert_matmul_rows(model: ModelSpec, train: TrainSpec, roles: Roles) -> tuple[int, int]:
    """(experts a device computes, rows of each one's grouped matmul) for one micro-batch."""
    ms = MoeShapes.of(model, train, roles)
    return ms.groups, ms.group_rows
