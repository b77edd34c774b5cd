"""MaxText's pipeline keys for a plan whose `pipeline` axis is larger than 1 (docs/design.md
section 12): the step's stages (`workload.stages`) in MaxText's words.

Facts from MaxText (commit e591f30, src/maxtext/configs/base.yml, configs/types.py,
layers/decoders.py, layers/pipeline.py): the pipeline degree is `ici_pipeline_parallelism` x
`dcn_pipeline_parallelism` (its mesh axis `stage`, moved before `data` in `mesh_axes` when
pipelining); stages x `num_pipeline_repeats` x `num_layers_per_pipeline_stage` must equal
`pipeline_parallel_layers` (its default of one layer a stage makes the pipeline circular, so
GPipe needs the layers a stage named); `num_pipeline_microbatches` must be a multiple of the
stages and divide the batch of one forward pass (per_device_batch_size x devices); base.yml
recommends `scan_layers=false` with a pipeline, the pipeline iterations scanned instead. The
layers it does not pipeline run with `stage` acting as data: for DeepSeek the dense and
leading MoE layers before the pipeline (only MoE layers are pipelined), for other models the
layers after it. Remat (layers/pipeline.py, layers/nnx_decoders.py): with the defaults
`set_remat_policy_on_pipeline_iterations=true` and `scan_pipeline_iterations=true` one
`jax.checkpoint` wraps a whole iteration, its policy saving the names `iteration_input` and
`decoder_layer_input` (plus the remat policy's, none for `full`); the NNX pipeline stage
applies no remat to its layers (`set_remat_policy_on_layers_per_stage` is read only by the
Linen `get_pipeline_stage_module`, which nothing calls), and turning the iteration's off saves
every intermediate of every iteration. That is the step's `pipeline_remat="iteration"` (its
chunk's layers unrolled in one checkpoint), priced as such; no key gives the step's default
per-layer checkpoint, so a plan priced with it is exported at MaxText's defaults and a note
says what they cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MeshConfigError
from ..workload.layout import Roles, stages_of

if TYPE_CHECKING:
    from ..workload.model import ModelSpec
    from ..workload.spec import TrainSpec

# The one MaxText model whose pipeline takes the last layers (its MoE layers, after the dense).
LEADING_REST = ("deepseek-v3",)


def pipeline_keys(
    r: Roles, train: TrainSpec, model: ModelSpec | None
) -> tuple[dict[str, str], list[str]]:
    """MaxText's pipeline keys and notes for these roles (none without a pipeline axis larger
    than 1); a MeshConfigError naming the field where MaxText refuses what the step takes."""
    if r.pipeline is None or r.size("pipeline") == 1:
        return {}, []
    S = r.size("pipeline")
    if model is None:
        raise MeshConfigError(
            f"to_maxtext: the pipeline axis {r.pipeline!r} ({S} stages) needs the model: "
            "MaxText's num_layers_per_pipeline_stage and pipeline_parallel_layers count its "
            "layers; accepted: to_maxtext(train, model=...) (--model on the command line)"
        )
    mixed = model.num_experts > 0 and (model.first_dense_layers > 0 or model.moe_every > 1)
    if mixed and model.name not in LEADING_REST:
        raise MeshConfigError(
            f"to_maxtext: model {model.name!r} mixes dense and MoE layers (first_dense_layers="
            f"{model.first_dense_layers}, moe_every={model.moe_every}), whose pipeline MaxText "
            f"builds from one kind of layer only for {', '.join(LEADING_REST)}; accepted: a "
            "pipelined plan with a model of alike layers, or that model"
        )
    st = stages_of(model, train, r)  # the step's checks of the pipeline fields
    assert st is not None
    if st.microbatches % S:
        rows = train.global_batch // train.microbatches // r.size("batch")
        fits = [m for m in range(S, rows + 1, S) if rows % m == 0]
        raise MeshConfigError(
            f"to_maxtext: pipeline_microbatches={train.pipeline_microbatches} ({st.microbatches}"
            f" micro-batches) is no multiple of the {S} stages of the pipeline axis "
            f"{r.pipeline!r}, which MaxText's num_pipeline_microbatches must be; accepted: 0 (as "
            f"many as stages) or a multiple of {S} that divides the batch, e.g. {fits[:6]}"
        )
    keys = {
        "num_pipeline_microbatches": str(st.microbatches),
        "num_pipeline_repeats": str(st.repeats),
        "num_layers_per_pipeline_stage": str(st.per_chunk),
        "pipeline_parallel_layers": str(st.layers),
        "scan_layers": "false",
    }
    kind = "GPipe" if st.repeats == 1 else f"circular, {st.repeats} repeats"
    notes = [
        f"pipeline -> stage: {S} stages ({kind}), {st.microbatches} micro-batches, "
        f"{st.per_chunk} layers a stage a repeat, the last {st.layers} of {model.num_layers} "
        "layers pipelined; scan_layers=false as base.yml recommends (MaxText scans the "
        "pipeline iterations)"
    ]
    if st.schedule == "1f1b":
        closest = "GPipe" if st.repeats == 1 else "the circular schedule"
        notes.append(
            f"lost: the {'1F1B' if st.repeats == 1 else 'interleaved 1F1B'} schedule; MaxText "
            f"has GPipe and circular only (at e591f30), so the keys above are {closest} at the "
            "same micro-batches and repeats: its bubble and step, but every iteration's "
            "activations held (estimate with pipeline_schedule='gpipe' for its memory)"
        )
    if st.per_chunk > 1 and st.remat == "layer" and train.remat != "none":  # "none": alike
        notes.append(
            "memory: MaxText remats a pipeline iteration as one block (its default "
            "set_remat_policy_on_pipeline_iterations, keeping each layer's input; at e591f30 no "
            "key remats the layers inside a stage), so the backward pass of an iteration holds "
            f"the recomputed intermediates of all {st.per_chunk} layers of a chunk at once, "
            "this plan's step one layer's: estimate with pipeline_remat='iteration' "
            "(--pipeline-remat iteration) for MaxText's memory (docs/exports.md)"
        )
    if st.layers < model.num_layers and model.name not in LEADING_REST:
        notes.append(
            f"approximate: MaxText pipelines the first {st.layers} layers and runs the other "
            f"{model.num_layers - st.layers} after them, the step the last {st.layers} after the "
            "others (alike layers: the same shapes, the order of the weights differs)"
        )
    return keys, notes
