"""The pipeline's part of `choose_mesh`'s search (cost/choose/mesh.py): which meshes with a
pipeline axis larger than 1 the cost model prices, and the pipeline recipes each is searched
with.

A mesh whose pipeline axis holds S > 1 stages is searched as cost/pipeline/stages.py prices it:
dense and MoE layers over pipeline, fsdp, data, tensor, sequence and expert axes. Its recipes
are every searched recipe times the pipeline's micro-batches M in (S, 2S, 4S) and repeats R in
(1, 2), each field a recipe pins kept as pinned. The schedule: GPipe, and 1F1B where GPipe's
memory does not fit at the fewest micro-batches (cost/choose/recipes.py `_best`: 1F1B's step
is GPipe's or slower, so it wins only by fitting); the train's or a recipe's schedule where
given. The counts that do not divide the
batch or the layers are dropped by the recipe search (cost/choose/recipes.py). Fewer
micro-batches and repeats come first: among equal steps the search keeps the earlier recipe.
On a mesh without a pipeline the pipeline fields are dropped (the step reads them only beside
a pipeline axis larger than 1).

Searched by default (`dcn_pipelines`) on hardware of several granules: a pipeline axis
wholly across granules, ahead of the search's own axes.
"""

from __future__ import annotations

from typing import Any

from ...workload.layout import PIPELINE_NAMES, Roles
from ...workload.spec import ModelSpec, TrainSpec
from ...workload.stages import dividing_layers
from .recipes import PIPELINE_FIELDS, divisors
from .space import Space

MICROBATCHES = (1, 2, 4)  # the pipeline's micro-batches searched, in stages
REPEATS = (1, 2)  # the pipeline's repeats searched


def pipeline_recipes(wanted: list[dict[str, Any]], r: Roles) -> list[dict[str, Any]]:
    """The recipes to search on this mesh: `wanted`, each times the pipeline's fields that it
    does not pin where the mesh has a pipeline axis larger than 1, else without them."""
    stages = r.size("pipeline")
    out: list[dict[str, Any]] = []
    for w in wanted:
        if stages == 1:
            plain = {k: v for k, v in w.items() if k not in PIPELINE_FIELDS}
            if plain not in out:
                out.append(plain)
            continue
        micro = [w["pipeline_microbatches"]] if "pipeline_microbatches" in w else None
        repeats = [w["pipeline_repeats"]] if "pipeline_repeats" in w else list(REPEATS)
        for m in micro or [k * stages for k in MICROBATCHES]:
            for rep in repeats:
                out.append(w | {"pipeline_microbatches": m, "pipeline_repeats": rep})
    return out


def dcn_pipelines(space: Space, granules: int, model: ModelSpec, train: TrainSpec) -> list[Space]:
    """The pipelines the default search adds to `space` (docs/design.md section 12: over DCN
    first): a pipeline axis ahead of its axes whose S stages each span G / S whole granules
    (DCN factor S, ICI factor 1), for every S > 1 dividing the G granules and the pipelined
    layers (`pipeline_layers`, else the most last layers of one kind S divides: search.py's
    `for_mesh`). Only across granules: there the stages replace a batch
    axis's weight gathers or gradient reductions over the slow network, each step, by their
    micro-batches' activations; inside a granule FSDP and data parallelism run on the fast
    links and stages only add their bubble (tests/cost/test_choose_pipeline.py). Stages over
    ICI as well would multiply the search by the divisors of the device count; an explicit
    `axes` with a pipeline axis searches them."""
    if granules == 1 or any(a in PIPELINE_NAMES for a in space.names):
        return []
    name = PIPELINE_NAMES[0]
    return [
        Space((name, *space.names), space.batch, ((s, s),))
        for s in divisors(granules)
        if s > 1
        and (train.pipeline_layers % s == 0 if train.pipeline_layers else dividing_layers(model, s))
    ]
