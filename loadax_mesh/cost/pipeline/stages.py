"""What the pipelined step's cost is built from (docs/design.md section 12; the step:
workload/pipeline.py; what each term holds and the compiled steps that referee it:
docs/cost-terms.md).

A plan whose `pipeline` axis has S > 1 stages runs the last `pipeline_layers` layers as S
stages of R repeats (chunks of `per_chunk` layers), M micro-batches flowing through them in
M * R + S - 1 iterations of a scan; every other part of the step (the lead layers, the
embedding, the head and the loss) runs with the pipeline axis acting as data. The bubble's
share of the schedule is (S - 1) / (M R + S - 1). This module holds the stages' layout as the
cost model reads it: the roles outside the stages, a stage's view of the batch, its layer
passes and its parameters; pipeline/memory.py, pipeline/traffic.py and pipeline/time.py price
the step from the plain step's parts.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ...errors import MeshConfigError
from ...workload.layout import Roles, param_shapes, stages_of
from ...workload.spec import ModelSpec, TrainSpec
from ...workload.stages import STAGED, Stages, staged_shapes
from ...workload.zero import optimizer_axes
from ..parts.shapes import cut, stored


def pipeline_of(model: ModelSpec, train: TrainSpec, r: Roles) -> Stages | None:
    """The step's stages on these roles (None without a pipeline axis larger than 1); a
    MeshConfigError for what the cost model does not price beside a pipeline yet."""
    st = stages_on(model, train, r)
    if st is None:
        return None
    if "offload" in train.placements.values():
        raise MeshConfigError(
            f"remat={train.remat_text!r} with pipeline stages is not priced by the cost model "
            "yet; accepted: tensors kept on the device or recomputed"
        )
    return st


@lru_cache(maxsize=16384)
def stages_on(model: ModelSpec, train: TrainSpec, r: Roles) -> Stages | None:
    """`layout.stages_of`, found once a recipe and mesh (a search asks for each recipe's stages
    as it prices its memory and its time); its MeshConfigError, uncached, for fields that do
    not fit."""
    return stages_of(model, train, r)


@lru_cache(maxsize=4096)
def data_roles(r: Roles) -> Roles:
    """The roles outside the pipelined layers: the pipeline axis a batch axis (mesh order)."""
    return replace(r, batch=tuple(a for a, _ in r.sizes if a in r.batch or a == r.pipeline))


@lru_cache(maxsize=4096)
def stage_train(train: TrainSpec, st: Stages) -> TrainSpec:
    """`train` as a stage sees its rows: each gradient-accumulation slice cut into the
    pipeline's micro-batches; under 1F1B with full remat whatever the policy (each layer's
    backward recomputes it from its input: workload/pipeline_1f1b.py)."""
    micro = train.microbatches * st.microbatches
    if st.schedule == "1f1b":
        return replace(train, microbatches=micro, remat="full")
    return replace(train, microbatches=micro)


def stage_passes(st: Stages) -> float:
    """Layer passes a stage runs per micro-batch of its rows: per_chunk every iteration,
    bubble included (per_chunk (M R + S - 1) / M; without a bubble, its L_p / S layers)."""
    return st.per_chunk * st.iterations / st.microbatches


def moe_stages(st: Stages) -> int:
    """1 where the stages hold MoE layers, else 0."""
    return int(st.stack == "moe_layers")


def shard_elements(
    model: ModelSpec,
    st: Stages,
    r: Roles,
    nbytes: int,
    tile: tuple[int, int] | None,
    *,
    staged: bool | None = None,
    optimizer: bool = False,
) -> int:
    """Bytes of one device's parameters in the stage layout (`stages.staged_shapes`: the
    pipelined layers' stage dim over the pipeline axis), stored in `nbytes`-byte words;
    `staged` True: only the pipelined weights, False: only the rest; `optimizer` True: as
    ZeRO-1 cuts one of Adam's moments (`zero.optimizer_axes`). Found once per layout
    (`layout`): the recipe's pipeline micro-batches and checkpoints do not change it."""
    return _shard_elements(model, layout(st), r, nbytes, tile, staged, optimizer)


def part_bytes(model: ModelSpec, st: Stages, r: Roles, nbytes: int, name: str) -> int:
    """Bytes of one device's shard of the parameter `name` in the stage layout, in
    `nbytes`-byte words."""
    return stored(dict(_cuts(model, layout(st), r, False))[name], nbytes, None)


@lru_cache(maxsize=4096)
def layout(st: Stages) -> Stages:
    """`st` with only what places the parameters (stages, repeats, the pipelined layers and
    those before them, `staged_shapes`'s reads): the micro-batches, checkpoints and schedule
    at fixed values, so that every recipe on one layout shares its parameters' bytes."""
    return replace(st, microbatches=st.stages, remat="layer", schedule="gpipe")


@lru_cache(maxsize=4096)
def _shard_elements(
    model: ModelSpec,
    st: Stages,
    r: Roles,
    nbytes: int,
    tile: tuple[int, int] | None,
    staged: bool | None,
    optimizer: bool,
) -> int:
    """`shard_elements` on a layout."""
    return sum(
        stored(part, nbytes, tile)
        for name, part in _cuts(model, st, r, optimizer)
        if staged is None or name.startswith(STAGED) == staged
    )


@lru_cache(maxsize=1024)
def _cuts(
    model: ModelSpec, st: Stages, r: Roles, optimizer: bool
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each parameter of the stage layout `st` and its shape on one device (every word size
    and part of the parameters summed from these); `optimizer`: an Adam moment's under
    ZeRO-1."""
    sizes, out = dict(r.sizes), []
    for name, (shape, logical) in staged_shapes(param_shapes(model), st).items():
        entries = (
            optimizer_axes(r.mesh_axes(logical), shape, sizes, r.data_parallel_axes())
            if optimizer
            else r.mesh_axes(logical)
        )
        out.append((name, cut(shape, entries, sizes)))
    return tuple(out)
