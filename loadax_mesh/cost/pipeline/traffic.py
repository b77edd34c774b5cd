"""The collectives of a pipelined step, by axis (docs/cost-terms.md says what each is and
which compiled steps referee it).

FSDP gathers a stage's layer weights every iteration, forward and backward, and reduces their
gradients every iteration, plus the lead layers' and the tables' as a plain step. The tensor
and sequence axes carry a plain layer's activation collectives on each of a stage's layer
passes (a pipeline micro-batch's rows each), and the lead layers' and the head's on the rows of
the step's layout; the sequence axis shards the weights as FSDP does. The pipeline axis
carries the stage-to-stage activations (exposed: on the schedule's critical path), the
micro-batches gathered to every stage and their gradients summed, the head's inputs and their
gradients (`_head`), the lookup's gradient rows, and the gradients of what it replicates.
"""

from __future__ import annotations

from dataclasses import replace

from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles, regathered, regathered_weights
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ...workload.stages import Stages
from ..parts.shapes import Shapes
from ..parts.traffic import (
    Collective,
    exchanges,
    layer_collectives,
    moe_collectives,
    seq_collectives,
    shard_axis,
    tensor_collectives,
    weight_arrays,
)
from ..timing.axes import AxisTraffic, axis_total
from .stages import data_roles, moe_stages, part_bytes, shard_elements, stage_train


def pipeline_collectives(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    *,
    overlapped: bool = False,
    regather: bool = False,
) -> list[Collective]:
    """parts/traffic.collectives for a pipelined step (as the module says), by axis;
    `overlapped` and `regather` as there. Everything runs once per gradient-accumulation
    micro-batch."""
    cd = dtype_bytes(train.compute_dtype)
    outside = shard_elements(model, st, r, cd, None, staged=False)
    staged = shard_elements(model, st, r, cd, None, staged=True)
    return (
        _weights(model, train, r, st, outside + staged, overlapped=overlapped, regather=regather)
        + _activations(model, train, r, st, overlapped=overlapped)
        + _between_stages(model, train, r, st, outside)
    )


def _weights(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    shard: int,
    *,
    overlapped: bool,
    regather: bool,
) -> list[Collective]:
    """The FSDP axis's weight gathers and gradient scatters, every layer pass a device runs
    (the lead layers' and a stage's every iteration) and the tables', and each data-parallel
    axis's all-reduce of the device's gradient shards (`shard` bytes), one array at a time
    (under ZeRO-1 a reduce-scatter, and the updated parameters gathered once a step)."""
    cd, mb, d = dtype_bytes(train.compute_dtype), train.microbatches, model.d_model
    lead = st.lead_dense + st.lead_moe
    runs = (lead + st.per_chunk * st.iterations) * mb  # layer passes a device gathers for
    # ... of them MoE layers' (the lead ones, and the stages' where they hold MoE layers)
    moe_runs = (st.lead_moe + st.per_chunk * st.iterations * moe_stages(st)) * mb
    m = r.size("model")
    found: list[Collective] = []
    tables = (1 if model.tied_embeddings else 2) * model.vocab_size // m * d * cd
    a = shard_axis(r)
    if a is not None:
        found += (
            moe_collectives(model, train, r, a, in_line=overlapped,
                            runs=(runs - moe_runs, moe_runs))
            if model.num_experts
            else layer_collectives(model, a, m, cd, runs, in_line=overlapped)
        )  # fmt: skip
        qkv = regathered_weights(model, regathered(model, train, r), m) * cd * regather
        if qkv:
            found.append(Collective(a, "all-gather", "q, k, v weights again", qkv, runs,
                                    not overlapped))  # fmt: skip
        found += [
            Collective(a, "all-gather", "embedding tables", tables, mb, True),
            Collective(a, "reduce-scatter", "embedding gradients", tables, mb, True),
        ]
        chunks = train.logits_chunks
        if chunks > 1:  # as parts/traffic.collectives
            table = model.vocab_size // m * d * cd
            found += [
                Collective(a, "all-gather", "unembedding per chunk", table, (2 * chunks - 1) * mb,
                           True),
                Collective(a, "reduce-scatter", "unembedding gradient per chunk", table,
                           (chunks - 1) * mb, True),
            ]  # fmt: skip
    arrays = weight_arrays(model) * (lead + st.layers // st.stages)
    zero1 = train.optimizer_over_data  # as parts/traffic.data_collectives
    kind = "reduce-scatter" if zero1 else "all-reduce"
    params = shard * dtype_bytes(train.param_dtype) // cd
    for a in r.data_parallel_axes():
        found.append(Collective(a, kind, "layer weight gradients", shard // arrays, arrays * mb,
                                True))  # fmt: skip
        if zero1:
            found.append(Collective(a, "all-gather", "updated parameters", params, 1, False))
    return found


def _activations(
    model: ModelSpec, train: TrainSpec, r: Roles, st: Stages, *, overlapped: bool
) -> list[Collective]:
    """The tensor and sequence axes' activation collectives and the expert axis's exchanges:
    the lead layers and the head on a replica's rows split over the pipeline axis too, the
    stage's layer passes (the bubble's included) on a pipeline micro-batch's rows."""
    ts, mb, lead = stage_train(train, st), train.microbatches, st.lead_dense + st.lead_moe
    rd, passes = data_roles(r), st.per_chunk * st.iterations * mb
    found = _run(
        tensor_collectives(model, train, rd, layer_runs=lead * mb, head_runs=mb,
                           overlapped=overlapped)
        + seq_collectives(model, train, rd, layer_runs=lead * mb)
    )  # fmt: skip
    found += _run(
        tensor_collectives(model, ts, r, layer_runs=passes, head_runs=0, overlapped=overlapped)
        + seq_collectives(model, ts, r, layer_runs=passes)
        + exchanges(model, ts, r, layer_runs=passes * moe_stages(st)),
        " in the stages",
    )
    found += _run(exchanges(model, train, rd, layer_runs=st.lead_moe * mb))
    return found


def _between_stages(
    model: ModelSpec, train: TrainSpec, r: Roles, st: Stages, outside: int
) -> list[Collective]:
    """The pipeline axis's own collectives; `outside` the bytes of the device's parameters
    outside the stages (in the compute dtype), whose gradients the axis reduces."""
    cd, mb, d, m = (
        dtype_bytes(train.compute_dtype),
        train.microbatches,
        model.d_model,
        r.size("model"),
    )
    p, chunked = st.axis, train.logits_chunks > 1
    sh, stage = Shapes.of(model, train, r), Shapes.of(model, stage_train(train, st), r)
    # A replica's activations on this device, one slice, their hidden dim cut over the tensor
    # axis (the lookup's gradient is gathered whole over it first: parts/traffic.py); one
    # pipeline micro-batch's likewise.
    rows = sh.micro_rows * sh.seq * d // m
    micro = stage.micro_rows * stage.seq * d // m * cd
    # The parameters the pipeline axis replicates, less the input table (as cut on this mesh):
    # its gradient rows are gathered over the axis before the scatter-add (above), not reduced.
    table = 0 if model.tied_embeddings else part_bytes(model, st, r, cd, "embed")
    return [
        Collective(p, "collective-permute", "stage-to-stage activations", micro,
                   2 * st.iterations * mb, False),
        Collective(p, "all-gather", "micro-batches to every stage", rows * cd, mb, False),
        Collective(p, "all-reduce", "micro-batch gradients over stages", rows * 4, mb, False),
        *_head(st, rows * cd, micro // cd * 4, stage.micro_rows * stage.seq, mb, chunked),
        Collective(p, "all-gather", "lookup gradient rows", rows * m * cd, mb, False),
        Collective(p, "all-reduce", "unembedding, norm and lead layer gradients",
                   outside - table, mb, True),
    ]  # fmt: skip


def _head(
    st: Stages, results: int, micro: int, tokens: int, mb: int, chunked: bool
) -> list[Collective]:
    """How the head reaches the pipeline's output. GPipe's: the last stage's `results` taken
    back to the step's layout after the stages, their gradient sent back. 1F1B's, on each of
    its M micro-batches: the last stage's output summed to every stage (`micro` bytes in
    float32) and its gradient summed back, the cross-entropy's maxima, sums and target logits
    over the vocabulary's cut (float32 over the micro-batch's `tokens`; again in the backward
    where the logits are chunked: workload/loss.py)."""
    p = st.axis
    if st.schedule == "gpipe":
        return [
            Collective(p, "all-to-all", "last stage's results to the step's layout", results,
                       mb, False),
            Collective(p, "collective-permute", "their gradient to the last stage", results,
                       mb, False),
        ]  # fmt: skip
    runs = st.microbatches * mb
    return [
        Collective(p, "all-reduce", "last stage's output to every stage", micro, runs, False),
        Collective(p, "all-reduce", "its gradient back to the last stage", micro, runs, False),
        Collective(p, "all-reduce", "cross-entropy over the vocabulary's cut", 4 * tokens,
                   3 * (1 + chunked) * runs, False),
    ]  # fmt: skip


def _run(found: list[Collective], where: str = "") -> list[Collective]:
    """The collectives of `found` that run, each said to run `where`."""
    return [replace(c, what=c.what + where) if where else c for c in found if c.count]


def pipeline_axis(
    found: list[Collective], axis: str, ici: int, dcn: int, efficiency: float, facts: DeviceFacts
) -> AxisTraffic:
    """The pipeline axis's AxisTraffic (axis_time.axis_traffic's, role "pipeline"; a
    collective-permute priced as one transfer to one peer, axis_time._seconds)."""
    return axis_total(found, axis, "pipeline", ici, dcn, efficiency, facts)
