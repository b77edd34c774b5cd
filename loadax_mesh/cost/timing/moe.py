"""Step-time terms of MoE layers beyond their experts' matmuls (cost/timing/step.py adds them).

The dropping path's dispatch and combine. `moe="capacity"` is what MaxText's dropping runs
execute (the export writes `sparse_matmul=false` with the capacity factor): the tokens reach
their experts' capacity slots through one-hot einsums, per sequence of S tokens
(MaxText layers/moe.py, `generate_masks` and `dense_matmul`):

    dispatch  BSM,BSEC -> EBCM     combine  EBCM,BSEC -> BSM

with C = ceil(S k / E) x capacity_factor slots per expert and sequence. Each is a matmul of
2 S E C M FLOPs a sequence: its work grows with the sequence and the capacity, not with the
experts' width (at Mixtral 8x7B's S 4096, about a fifth of the experts' own FLOPs). Backward:
the dispatch mask is a one-hot of the routing (no gradient), so the dispatch runs once more
(the tokens' gradient); the combine mask carries the router's weights, so the combine runs
twice (the experts' output's gradient and the weights'). A remat that recomputes the MLP's
input runs both forward again. The FLOPs are the step's time, not `Estimate.flops`, which
counts the reference step's own program (its capacity slots filled by index).
"""

from __future__ import annotations

import math

from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..parts.moe import MoeShapes


def dispatch_einsums(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    *,
    rate: float,
    hbm: float,
    mxu: tuple[int, int],
    recomputed: bool,
    einsums: bool = True,
) -> tuple[float, float]:
    """Seconds one MoE layer spends in the dropping path's dispatch and combine einsums for one
    micro-batch on one device: (forward, all passes: forward, backward and, `recomputed`, the
    recompute); zeros for dropless, and where the priced program dispatches by index
    (`einsums` False: its slot buffers are memory-bound bytes, counted with the layer's).
    `rate` is the FLOP/s a matmul reaches, `hbm` the HBM bandwidth, `mxu` the matrix unit's
    tile (rows, columns)."""
    if train.moe != "capacity" or not einsums:
        return 0.0, 0.0
    rows = max(1, train.global_batch // roles.size("batch") // train.microbatches)
    s = model.seq_len // roles.size("seq")
    e, k = model.num_experts, model.experts_per_token
    slots = e * math.ceil(math.ceil(s * k / e) * train.capacity_factor)  # E x C
    d = model.d_model // roles.size("model")
    act = dtype_bytes(train.compute_dtype)

    def whole(n: int, unit: int) -> int:
        return -(-n // unit) * unit

    # [E C, S] x [S, M] per sequence (the combine: [S, E C] x [E C, M]): FLOPs with the dims
    # padded to whole tiles, or where longer the mask's, tokens' and result's bytes
    flops = 2.0 * whole(slots, mxu[0]) * whole(s, mxu[0]) * whole(d, mxu[1])
    moved = (s * slots + s * d + slots * d) * act
    one = rows * max(flops / rate, moved / hbm)
    again = 2 if recomputed else 0  # dispatch and combine, forward once more
    return 2 * one, one * (2 + 3 + again)


def permute_seconds(
    model: ModelSpec, train: TrainSpec, roles: Roles, *, hbm: float, share: float | None,
    recomputed: bool,
) -> float:  # fmt: skip
    """Seconds one MoE layer spends moving token rows by index on the dropless path, for one
    micro-batch on one device: forward, the copies gathered into expert order and the
    experts' output gathered back (with an expert axis, also the received buffer regrouped by
    local expert and back); backward, each gather's transpose, a scatter-add of the same rows;
    `recomputed`, the forward's gathers again. Rows move at `share` of the HBM bandwidth (the
    named calibration `permute_bandwidth`: a gather or scatter by row index runs far below a
    streaming copy); None: no such limit (their bytes at HBM speed are already among the
    memory-bound operations). One rate for both: at the dropless runs' shapes on v5p the TPU
    compiler compiles a scatter-add as a sort of its indices, a gather and a sorted scatter,
    and its roofline prices it within 20% of a gather (benchmarks/probes/probe_permute.py), so a
    custom VJP whose backward gathers (MaxText's `use_custom_sort_vjp`) is priced as the
    scatter-adds it replaces."""
    if train.moe != "dropless" or share is None:
        return 0.0
    ms = MoeShapes.of(model, train, roles)
    rows = ms.copies + (ms.rows if ms.ep > 1 else 0)
    moved = rows * model.d_model * dtype_bytes(train.compute_dtype)
    ops = 2 + 2 + (2 if recomputed else 0)  # gathers, scatter-adds, recomputed gathers
    return ops * moved / (hbm * share)
