"""The cost of a pipelined step (docs/design.md section 12; the step: workload/pipeline.py).

A plan whose `pipeline` axis has S > 1 stages runs the last `pipeline_layers` layers as S
stages of R repeats (chunks of `per_chunk` layers), M micro-batches flowing through them in
M * R + S - 1 iterations of a scan; every other part of the step (the lead layers, the
embedding, the head and the loss) runs with the pipeline axis acting as data. What a device
pays, as the step does it:

- Compute. The lead layers, the head and the loss over the device's share of the batch split
  over the batch axes and the pipeline axis. A stage runs one chunk on one micro-batch (its
  replica's rows / M, split over the batch axes only) an iteration, the S - 1 iterations of
  the bubble on zeros: per_chunk * (M R + S - 1) layer passes of a micro-batch, the FLOPs of
  its L_p / S layers over its replica's rows times (M R + S - 1) / (M R). The bubble's share
  of the schedule is (S - 1) / (M R + S - 1).
- Memory. A stage's weights (its L_p / S layers, the lead layers, the tables and the final
  norm; cut over fsdp and the tensor axis as a plain step cuts them), their optimizer state
  and gradients; what the scan over iterations saves for the backward pass: every
  iteration's chunk, per_chunk layers of one micro-batch as the remat policy keeps them (the
  bubble's too; the layer picks its weights inside its checkpoint, so none are saved); the
  lead layers' as a plain step's. While the stages' backward pass runs (the buffer
  assignments of bench_cost's pipelined cases): one iteration's saved chunk copied out, its
  chunk of weights picked again in the compute dtype and that chunk's float32 weight
  gradient beside their running sum, the pipeline's buffers (the
  micro-batches and the results in the compute dtype), and the forward pass's logits, kept
  until the unembedding's gradient is taken after it (beside a sequence axis it is taken
  before; so it is in the 4-layer v5p-16 compiles of a 32000 vocabulary, dense and MoE alike,
  which the term over-counts: no rule found yet, benchmarks/RESULTS.md). Activations are cut
  over the tensor axis (the residual stream's hidden dim) and the sequence axis as a plain
  step's. With one checkpoint an iteration (`pipeline_remat="iteration"`, MaxText's) the
  backward pass of a chunk recomputes all its layers before it differentiates them: the other
  per_chunk - 1 layers hold what they keep for it (`saved.unrolled_residuals`).
- Collectives. FSDP gathers a stage's layer weights every iteration, forward and backward,
  and reduces their gradients every iteration (the step's scan gathers in the layer, as
  MaxText's pipeline does by default), plus the lead layers' and the tables' as a plain step.
  The tensor and sequence axes carry a plain layer's activation collectives (traffic.py's
  `tensor_collectives`, `seq_collectives`) on each of a stage's layer passes, a pipeline
  micro-batch's rows each, and the lead layers' and the head's on the rows of the step's
  layout (the pipeline axis acting as data). The sequence axis, which replicates the
  weights, also sums each stage layer pass's weight gradients (an all-reduce in the scan's
  backward pass, every iteration). The pipeline axis carries the stage-to-stage
  activations (a micro-batch's, in the compute dtype, each iteration forward and back:
  collective-permutes on the schedule's critical path, exposed), the micro-batches gathered
  to every stage at entry (an all-gather, and in the backward pass the stages' gradients of
  them summed in float32: an all-reduce), the last stage's results taken back to the step's
  layout (an all-to-all forward, a collective-permute of the gradient backward), all of
  them cut over the tensor axis as the activations are; the lookup's gradient rows gathered
  for the table's scatter-add (whole: gathered over the tensor axis first); and the
  unembedding's gradient all-reduced (it is replicated over the pipeline axis; beside a
  sequence axis the compiler reduces it over both at once). The compiled steps also reorder
  the devices of these buffers by permutes spanning the pipeline and fsdp axes together,
  well under 1% of the step's bytes: not counted.

MoE layers in the stages (and lead ones) are priced with the plain step's functions and a
layer-pass count: their FLOPs (routed experts as the platform runs them), the expert axis's
all-to-alls per pass on a pipeline micro-batch's rows, the experts' FSDP gathers every
iteration, their saved block and working set (Mixtral's layers on v5p-16, pipeline 2 x fsdp 2
x expert 2: memory 1.04 of libtpu's assignment, expert bytes 0.99; benchmarks/RESULTS.md).

Priced: dense and MoE models (MLA and parallel blocks included) over pipeline, fsdp, data,
tensor, sequence and expert axes. Refused with a MeshConfigError: offloaded tensors beside a
pipeline (not priced yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

from ...errors import MeshConfigError
from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles, param_shapes, regathered, regathered_weights, stages_of
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ...workload.stages import STAGED, Stages, staged_shapes
from ..memory.layer import layer_bytes
from ..parts.shapes import Shapes, shard_bytes, stored
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
from ..parts.weights import dense_layer_weights, moe_layer_weights
from ..timing.axes import AxisTraffic, axis_total
from ..timing.memory_bound import update_bytes
from ..timing.step import StepTime, step_time


@dataclass(frozen=True)
class Pipeline:
    """The pipeline an estimate priced: `stages` S over `axis`, `microbatches` M, `repeats` R,
    the last `layers` layers pipelined in chunks of `per_chunk`, `iterations` M R + S - 1,
    of which `bubble` (S - 1) / (M R + S - 1) is the share of the schedule idle stages
    compute on zeros; `remat` where the stages checkpoint (TrainSpec.pipeline_remat)."""

    axis: str
    stages: int
    microbatches: int
    repeats: int
    layers: int
    per_chunk: int
    iterations: int
    bubble: float
    remat: str


def pipeline_of(model: ModelSpec, train: TrainSpec, r: Roles) -> Stages | None:
    """The step's stages on these roles (None without a pipeline axis larger than 1); a
    MeshConfigError for what the cost model does not price beside a pipeline yet."""
    st = stages_of(model, train, r)
    if st is None:
        return None
    if "offload" in train.placements.values():
        raise MeshConfigError(
            f"remat={train.remat_text!r} with pipeline stages is not priced by the cost model "
            "yet; accepted: tensors kept on the device or recomputed"
        )
    return st


def summary(st: Stages) -> Pipeline:
    """What `Estimate.pipeline` says of the stages."""
    return Pipeline(
        axis=st.axis,
        stages=st.stages,
        microbatches=st.microbatches,
        repeats=st.repeats,
        layers=st.layers,
        per_chunk=st.per_chunk,
        iterations=st.iterations,
        bubble=bubble(st.stages, st.microbatches, st.repeats),
        remat=st.remat,
    )


def bubble(stages: int, microbatches: int, repeats: int) -> float:
    """The share of the schedule's iterations in which a stage has no micro-batch:
    (S - 1) / (M R + S - 1)."""
    return (stages - 1) / (microbatches * repeats + stages - 1)


def data_roles(r: Roles) -> Roles:
    """The roles outside the pipelined layers: the pipeline axis a batch axis (mesh order)."""
    return replace(r, batch=tuple(a for a, _ in r.sizes if a in r.batch or a == r.pipeline))


def stage_train(train: TrainSpec, st: Stages) -> TrainSpec:
    """`train` as a stage sees its rows: each gradient-accumulation slice cut into the
    pipeline's micro-batches."""
    return replace(train, microbatches=train.microbatches * st.microbatches)


def stage_passes(st: Stages) -> float:
    """Layer passes a stage runs per micro-batch of its rows: per_chunk every iteration,
    bubble included (per_chunk (M R + S - 1) / M; without a bubble, its L_p / S layers)."""
    return st.per_chunk * st.iterations / st.microbatches


def shard_elements(
    model: ModelSpec,
    st: Stages,
    r: Roles,
    nbytes: int,
    tile: tuple[int, int] | None,
    *,
    staged: bool | None = None,
) -> int:
    """Bytes of one device's parameters in the stage layout (`stages.staged_shapes`: the
    pipelined layers' stage dim over the pipeline axis), stored in `nbytes`-byte words;
    `staged` True: only the pipelined weights, False: only the rest."""
    total = 0
    for name, (shape, logical) in staged_shapes(param_shapes(model), st).items():
        if staged is not None and name.startswith(STAGED) != staged:
            continue
        cut = []
        for d, axis in zip(shape, r.mesh_axes(logical), strict=True):
            axes = (axis,) if isinstance(axis, str) else axis or ()
            cut.append(d // math.prod(dict(r.sizes)[a] for a in axes))
        total += stored(tuple(cut), nbytes, tile)
    return total


def pipeline_flops(
    model: ModelSpec, train: TrainSpec, r: Roles, st: Stages, *, grouped: str = "libtpu"
) -> tuple[float, float, float]:
    """flops.step_flops for a pipelined step: (executed, model, recompute) per device. The
    lead layers and the head over the device's rows split over the pipeline axis too; the
    stage's layers `stage_passes` times over its replica's rows (the bubble's zeros
    computed), a MoE layer's routed experts on the rows a pipeline micro-batch gives them
    (`grouped`: as step_flops); the model's own FLOPs those of a plain step over every axis."""
    from ..parts.flops import layer_flops, step_flops

    rd, ts = data_roles(r), stage_train(train, st)
    model_flops = step_flops(model, train, rd)[1]
    head, chunked = 2.0 * model.vocab_size * model.d_model, train.logits_chunks > 1
    dense, dense_again = layer_flops(model, train, rd, grouped=grouped, moe=False)
    moe, moe_again = layer_flops(model, train, rd, grouped=grouped, moe=bool(st.lead_moe))
    layer, again = layer_flops(model, ts, r, grouped=grouped, moe=st.stack == "moe_layers")
    outside = Shapes.of(model, train, rd).tokens
    inside = Shapes.of(model, train, r).tokens * stage_passes(st)
    m = r.size("model")
    flops = outside * (st.lead_dense * dense + st.lead_moe * moe + head * (3 + chunked))
    flops += inside * layer
    recompute = outside * (st.lead_dense * dense_again + st.lead_moe * moe_again)
    recompute += outside * head * chunked + inside * again
    return flops / m, model_flops, recompute / m


def pipeline_collectives(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    *,
    overlapped: bool = False,
    regather: bool = False,
) -> list[Collective]:
    """traffic.collectives for a pipelined step (module docstring), by axis; `overlapped` and
    `regather` as there. Everything runs once per gradient-accumulation micro-batch."""
    ts = stage_train(train, st)
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
        if chunks > 1:  # as traffic.collectives
            table = model.vocab_size // m * d * cd
            found += [
                Collective(a, "all-gather", "unembedding per chunk", table, (2 * chunks - 1) * mb,
                           True),
                Collective(a, "reduce-scatter", "unembedding gradient per chunk", table,
                           (chunks - 1) * mb, True),
            ]  # fmt: skip
    k = weight_arrays(model)
    outside = shard_elements(model, st, r, cd, None, staged=False)
    staged = shard_elements(model, st, r, cd, None, staged=True)
    for a in r.data_parallel_axes():  # every gradient shard all-reduced, one array at a time
        arrays = k * (lead + st.layers // st.stages)
        found += [
            Collective(a, "all-reduce", "layer weight gradients", (outside + staged) // arrays,
                       arrays * mb, True),
        ]  # fmt: skip
    # The tensor and sequence axes' activation collectives: the lead layers and the head on a
    # replica's rows split over the pipeline axis too, the stage's layer passes (the bubble's
    # included) on a pipeline micro-batch's rows.
    rd, passes = data_roles(r), st.per_chunk * st.iterations * mb
    found += _run(
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
    if r.seq is not None and r.size("seq") > 1:
        # The sequence axis replicates the weights: the scan's backward pass sums each
        # iteration's weight gradients (a layer's shard, in the compute dtype) over it before
        # adding them up, a layer pass at a time (the compiled steps of bench_cost).
        weights = (
            sum(moe_layer_weights(model, r)) if moe_stages(st) else dense_layer_weights(model, m)
        )
        shard = weights * cd // r.size("fsdp")
        found.append(Collective(r.seq, "all-reduce", "layer weight gradients in the stages",
                                shard, passes, True))  # fmt: skip
    p = st.axis
    sh, stage = Shapes.of(model, train, r), Shapes.of(model, ts, r)
    # A replica's activations on this device, one slice, their hidden dim cut over the tensor
    # axis (the lookup's gradient is gathered whole over it first: traffic.py); one pipeline
    # micro-batch's likewise.
    rows = sh.micro_rows * sh.seq * d // m
    micro = stage.micro_rows * stage.seq * d // m * cd
    # The parameters the pipeline axis replicates, less the input table: its gradient rows
    # are gathered over the axis before the scatter-add (above), not reduced after.
    table = 0 if model.tied_embeddings else model.vocab_size // m * d // r.size("fsdp") * cd
    found += [
        Collective(p, "collective-permute", "stage-to-stage activations", micro,
                   2 * st.iterations * mb, False),
        Collective(p, "all-gather", "micro-batches to every stage", rows * cd, mb, False),
        Collective(p, "all-reduce", "micro-batch gradients over stages", rows * 4, mb, False),
        Collective(p, "all-to-all", "last stage's results to the step's layout", rows * cd, mb,
                   False),
        Collective(p, "collective-permute", "their gradient to the last stage", rows * cd, mb,
                   False),
        Collective(p, "all-gather", "lookup gradient rows", rows * m * cd, mb, False),
        Collective(p, "all-reduce", "unembedding, norm and lead layer gradients",
                   outside - table, mb, True),
    ]  # fmt: skip
    return found


def moe_stages(st: Stages) -> int:
    """1 where the stages hold MoE layers, else 0."""
    return int(st.stack == "moe_layers")


def _run(found: list[Collective], where: str = "") -> list[Collective]:
    """The collectives of `found` that run, each said to run `where`."""
    return [replace(c, what=c.what + where) for c in found if c.count]


def pipeline_axis(
    found: list[Collective], axis: str, ici: int, dcn: int, efficiency: float, facts: DeviceFacts
) -> AxisTraffic:
    """The pipeline axis's AxisTraffic (axis_time.axis_traffic's, role "pipeline"; a
    collective-permute priced as one transfer to one peer, axis_time._seconds)."""
    return axis_total(found, axis, "pipeline", ici, dcn, efficiency, facts)


def pipeline_time(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    facts: DeviceFacts,
    collectives: tuple[float, float, float],
    efficiency: float,
    intensity: float | None,
    permute_share: float | None,
) -> StepTime:
    """time.step_time for a pipelined step (`collectives`: step_time's hidden, exposed and
    across-granule seconds): the lead layers, head, loss and update as a plain step's with the
    pipeline axis acting as data (the update over the stage's parameters), plus a stage's
    `stage_passes` layer passes on each of its micro-batches (its layer terms alone: the same
    step priced with no layer passes taken away). `efficiency`, `intensity` and
    `permute_share`: step_time's."""
    rd, ts = data_roles(r), stage_train(train, st)
    kernel = attention_kernel(train.attention, facts.platform)
    saved = partial(layer_bytes, model, saved=True, tile=facts.tile, kernel=kernel)
    lead = st.lead_dense + st.lead_moe

    def price(
        train: TrainSpec, roles: Roles, runs: float, moe: float, kept: float = 0.0
    ) -> StepTime:
        return step_time(model, train, roles, facts, efficiency=efficiency, intensity=intensity,
                         hidden=0.0, exposed=0.0, across_granules=0.0, offload_bytes=0.0,
                         kept_bytes=kept, permute_share=permute_share, layer_runs=runs,
                         moe_runs=moe)  # fmt: skip

    sh = Shapes.of(model, train, rd)
    lead_kept = st.lead_dense * saved(train, sh, rd)
    lead_kept += st.lead_moe and st.lead_moe * saved(train, sh, rd, moe=True)
    outer = price(train, rd, lead, st.lead_moe, lead_kept)
    passes, moe = stage_passes(st), bool(moe_stages(st))
    kept = passes * saved(ts, Shapes.of(model, ts, r), r, moe=moe)
    stage = price(ts, r, passes, passes * moe, kept)
    bare = price(ts, r, 0, 0)
    # the update streams the stage's parameters, not the whole model's shard (outer's)
    whole = (
        shard_bytes(model, rd, 1, None)
        if model.num_experts
        else model.num_params / (r.size("fsdp") * r.size("model"))
    )
    params = shard_elements(model, st, r, 1, None) - whole
    update = params * update_bytes(train) / facts.need("hbm_bandwidth")
    matmul = outer.matmul + stage.matmul - bare.matmul
    attention = outer.attention + stage.attention - bare.attention
    memory = outer.memory_bound + stage.memory_bound - bare.memory_bound + update
    compute = matmul + attention + memory
    hidden, exposed, across_granules = collectives
    return StepTime(
        matmul=matmul,
        attention=attention,
        memory_bound=memory,
        forward=outer.forward + stage.forward - bare.forward,
        hidden=hidden,
        exposed=exposed,
        across_granules=across_granules,
        offload=0.0,
        seconds=max(compute, hidden) + exposed + across_granules,
    )
