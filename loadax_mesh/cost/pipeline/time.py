"""The FLOPs and the step time of a pipelined step: the lead layers, head, loss and update
as a plain step's with the pipeline axis acting as data, plus a stage's layer passes on each of
its micro-batches (the bubble's zeros computed at full price), both priced by the plain step's
functions with a layer-pass count."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache, partial

from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from ...workload.stages import Stages
from ..memory.layer import layer_bytes
from ..parts.cache import without_pipeline
from ..parts.flops import layer_flops, step_flops
from ..parts.shapes import Shapes, shard_bytes
from ..timing.memory_bound import update_bytes
from ..timing.step import Compute, StepTime, step_time
from .stages import data_roles, moe_stages, shard_elements, stage_passes, stage_train


def pipeline_flops(
    model: ModelSpec, train: TrainSpec, r: Roles, st: Stages, *, grouped: str = "libtpu"
) -> tuple[float, float, float]:
    """flops.step_flops for a pipelined step: (executed, model, recompute) per device. The
    lead layers and the head over the device's rows split over the pipeline axis too; the
    stage's layers `stage_passes` times over its replica's rows (the bubble's zeros
    computed), a MoE layer's routed experts on the rows a pipeline micro-batch gives them
    (`grouped`: as step_flops); the model's own FLOPs those of a plain step over every axis."""
    rd, ts = data_roles(r), stage_train(train, st)
    model_flops = step_flops(model, train, rd)[1]
    head, chunked = 2.0 * model.vocab_size * model.d_model, train.logits_chunks > 1
    dense, dense_again = layer_flops(model, train, rd, grouped=grouped, moe=False)
    moe, moe_again = layer_flops(model, train, rd, grouped=grouped, moe=bool(st.lead_moe))
    layer, again = layer_flops(model, ts, r, grouped=grouped, moe=st.stack == "moe_layers")
    outside = Shapes.of(model, train, rd).tokens
    inside = Shapes.of(model, train, r).tokens * stage_passes(st)
    m = r.size("model")  # 1F1B's head: every micro-batch on a stage's slice of the vocabulary
    flops = outside * (st.lead_dense * dense + st.lead_moe * moe + head * (3 + chunked))
    flops += inside * layer
    recompute = outside * (st.lead_dense * dense_again + st.lead_moe * moe_again)
    recompute += outside * head * chunked + inside * again
    return flops / m, model_flops, recompute / m


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
    """timing/step.step_time for a pipelined step (`collectives`: step_time's hidden, exposed and
    across-granule seconds): the lead layers, head, loss and update as a plain step's with the
    pipeline axis acting as data (the update over the stage's parameters), plus a stage's
    `stage_passes` layer passes on each of its micro-batches (its layer terms alone: the same
    step priced with no layer passes taken away). `efficiency`, `intensity` and
    `permute_share`: step_time's."""
    work = pipeline_work(model, train, r, st, facts, efficiency, intensity, permute_share)
    return StepTime.of(work, collectives)


@lru_cache(maxsize=8192, typed=True)
def pipeline_work(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    facts: DeviceFacts,
    efficiency: float,
    intensity: float | None,
    permute_share: float | None,
) -> Compute:
    """`pipeline_time`'s compute, found once for the chooser's compute floor and its price."""
    rd, ts = data_roles(r), stage_train(train, st)
    kernel = attention_kernel(train.attention, facts.platform)
    saved = partial(layer_bytes, model, saved=True, tile=facts.tile, kernel=kernel)
    lead = st.lead_dense + st.lead_moe

    def price(
        train: TrainSpec, roles: Roles, runs: float, moe: float, kept: float = 0.0
    ) -> StepTime:
        return _work(model, _timed(train), roles, facts, efficiency, intensity, permute_share,
                     runs, moe, kept)  # fmt: skip

    sh = Shapes.of(model, train, rd)
    lead_kept = st.lead_dense and st.lead_dense * saved(train, sh, rd)
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
        else model.num_params / (r.size("weights") * r.size("model"))
    )
    params = shard_elements(model, st, r, 1, None) - whole
    update = params * update_bytes(train) / facts.need("hbm_bandwidth")
    # a stage's layer terms alone are the stage priced less the same step with no layer passes
    return outer.work + stage.work - bare.work + Compute(0.0, 0.0, update, 0.0)


@lru_cache(maxsize=8192)
def _timed(train: TrainSpec) -> TrainSpec:
    """`train` with only what step_time reads: no pipeline field (`without_pipeline`), and of
    the logits chunks only whether there are several (timing/matmuls.py, memory_bound.py)."""
    return replace(without_pipeline(train), logits_chunks=min(train.logits_chunks, 2))


@lru_cache(maxsize=16384, typed=True)
def _work(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    facts: DeviceFacts,
    efficiency: float,
    intensity: float | None,
    permute_share: float | None,
    runs: float,
    moe: float,
    kept: float,
) -> StepTime:
    """step_time with no collectives or offload and `runs` layer passes (`moe` of them MoE
    layers'), found once for every pipeline and logits-chunk count searched with a recipe:
    `train` comes with only what step_time reads (`_timed`)."""
    return step_time(model, train, roles, facts, efficiency=efficiency, intensity=intensity,
                     hidden=0.0, exposed=0.0, across_granules=0.0, offload_bytes=0.0,
                     kept_bytes=kept, permute_share=permute_share, layer_runs=runs,
                     moe_runs=moe)  # fmt: skip
