"""How the reference step cuts its decoder layers into pipeline stages (docs/design.md section
12): which layers are pipelined, into how many chunks, and the parameters' stage layout. Pure
Python: the checks run where the plan's roles are known (`layout.check_fit`), without jax.

The pipelined layers are the last `pipeline_layers` of the model (all of them by default), all
of one kind (dense or MoE: one stack of alike layers, as a scan needs), cut into stages x
repeats chunks of equal length. Chunk c holds layers c * per_chunk .. (c + 1) * per_chunk - 1
of them; stage s holds chunks r * stages + s for r < repeats (GPipe at one repeat, the circular
schedule above). The layers before the pipelined ones run with the pipeline axis acting as data.

In the step's parameters a pipelined stack `layers/w` or `moe_layers/w` of shape [L, ...] is
cut: its leading layers stay `layers/w` (or `moe_layers/w`) and the pipelined ones become
`stages/w` of shape [repeats, stages, per_chunk, ...], the stage dim sharded over the pipeline
axis, so each stage holds only its own chunks (MaxText's layout of pipelined weights).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from ..errors import MeshConfigError
from .spec import ModelSpec, PipelineRemat, PipelineSchedule, TrainSpec

Shapes = dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]

STAGED = "stages/"  # the prefix of the pipelined weights in the step's parameters


@dataclass(frozen=True, kw_only=True)
class Stages:
    """The pipeline of one step: `stages` S over the pipeline axis `axis`, `repeats` R chunks
    a stage, `microbatches` M, the last `layers` of the model pipelined from the stack `stack`
    ("layers" or "moe_layers"), after `lead_dense` dense and `lead_moe` MoE layers; `remat`
    where the stages checkpoint (TrainSpec.pipeline_remat), `schedule` the order they run
    micro-batches in (TrainSpec.pipeline_schedule)."""

    axis: str
    stages: int
    repeats: int
    microbatches: int
    layers: int
    stack: str
    lead_dense: int
    lead_moe: int
    remat: PipelineRemat = "layer"
    schedule: PipelineSchedule = "gpipe"

    @property
    def per_chunk(self) -> int:
        """Layers in one chunk (a stage runs `repeats` chunks)."""
        return self.layers // (self.stages * self.repeats)

    @property
    def iterations(self) -> int:
        """The schedule's length: every micro-batch through every chunk, plus the S - 1
        iterations of the bubble."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """The share of the schedule in which a stage has no micro-batch (`bubble`)."""
        return bubble(self.stages, self.microbatches, self.repeats)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: the fields, and the chunk length, iterations and bubble."""
        return asdict(self) | {
            "per_chunk": self.per_chunk,
            "iterations": self.iterations,
            "bubble": self.bubble,
        }

    @property
    def lead(self) -> int:
        """The layers before the pipelined ones, in the pipelined stack."""
        return self.lead_moe if self.stack == "moe_layers" else self.lead_dense


def bubble(stages: int, microbatches: int, repeats: int) -> float:
    """The share of the schedule's iterations in which a stage has no micro-batch:
    (S - 1) / (M R + S - 1)."""
    return (stages - 1) / (microbatches * repeats + stages - 1)


@lru_cache(maxsize=64)
def _kinds(model: ModelSpec) -> tuple[str, ...]:
    """Each layer's stack, in order: "moe_layers" for a MoE layer, "layers" for a dense one
    (found once a model: the chooser checks every recipe's stages)."""
    first, every, groups = model.first_dense_layers, model.moe_every, model.num_moe_layers
    moe = {first + k * every + every - 1 for k in range(groups)} if model.num_experts else set()
    return tuple("moe_layers" if i in moe else "layers" for i in range(model.num_layers))


def dividing_layers(model: ModelSpec, stages: int) -> int:
    """The most last layers of the model, all of one kind, that `stages` divide, where no more
    than one stage's share of layers is left to run before the pipeline (with its axis as
    data), else 0: the pipeline of a model whose layers the stages do not divide, as the
    chooser searches it (Megatron and torchtitan split such counts unevenly instead, a layer
    more on some stages)."""
    kinds = _kinds(model)
    tail = 1
    while tail < len(kinds) and kinds[-tail - 1] == kinds[-1]:
        tail += 1
    layers = tail - tail % stages
    return layers if layers and len(kinds) - layers <= layers // stages else 0


def pipeline_stages(
    model: ModelSpec,
    train: TrainSpec,
    *,
    axis: str,
    stages: int,
    batch: int,
    axes: tuple[str, ...],
) -> Stages:
    """The pipeline over the axis `axis` of `stages` stages, `batch` the degree of the batch
    axes `axes`; a MeshConfigError naming the field for a pipeline axis among the batch axes,
    a batch the pipeline and batch axes do not split (outside the pipelined layers the
    pipeline axis acts as data), or pipeline fields that do not fit the model or the batch."""
    if axis in axes:
        raise MeshConfigError(
            f"batch_axis_names {list(axes)} include the pipeline axis {axis!r} (size "
            f"{stages}): its stages run the layers one after the other, not on parts of the "
            "batch; accepted: batch axes without it"
        )
    rows = train.global_batch // train.microbatches  # the batch one pass of the pipeline takes
    if rows % (stages * batch):
        raise MeshConfigError(
            f"global_batch={train.global_batch} (over microbatches={train.microbatches}: {rows} "
            f"rows a pass) does not divide over the pipeline axis {axis!r} ({stages}) and the "
            f"batch axes ({batch}), which split it outside the pipelined layers; accepted: a "
            f"multiple of {stages * batch * train.microbatches}"
        )
    L = model.num_layers
    layers = train.pipeline_layers or L
    if layers > L:
        raise MeshConfigError(
            f"pipeline_layers={train.pipeline_layers} is more than the num_layers={L} of model "
            f"{model.name!r}; accepted: 0 (every layer) or a count up to {L}"
        )
    chunks = stages * train.pipeline_repeats
    if layers % chunks:
        raise MeshConfigError(
            f"pipeline_layers={train.pipeline_layers} ({layers} layers pipelined) does not "
            f"divide into {stages} stages (pipeline axis {axis!r}) x pipeline_repeats="
            f"{train.pipeline_repeats} chunks; accepted: a layer count that is a multiple of "
            f"{chunks}, or repeats and stages whose product divides {layers}"
        )
    kinds = _kinds(model)
    tail = set(kinds[L - layers :])
    if len(tail) > 1:
        one = [n for n in range(1, L + 1) if len(set(kinds[L - n :])) == 1]
        raise MeshConfigError(
            f"pipeline_layers={train.pipeline_layers}: model {model.name!r}'s last {layers} "
            "layers mix dense and MoE layers, which one pipelined stack cannot hold; accepted: "
            f"a count of last layers all of one kind (up to {max(one)})"
        )
    m = train.pipeline_microbatches or stages
    if m < stages:
        raise MeshConfigError(
            f"pipeline_microbatches={train.pipeline_microbatches} is fewer than the {stages} "
            f"stages of the pipeline axis {axis!r}; accepted: 0 (as many as stages) or at "
            f"least {stages}"
        )
    if rows % (m * batch):
        fits = [d for d in range(stages, rows // batch + 1) if rows % (d * batch) == 0]
        raise MeshConfigError(
            f"pipeline_microbatches={train.pipeline_microbatches} ({m} micro-batches) does not "
            f"divide the batch each stage sees, {rows} rows, into micro-batches its batch axes "
            f"({', '.join(axes) or 'none'}: {batch}) split evenly; accepted: 0 or a count of "
            f"at least {stages} that divides {rows // batch} (the rows of a batch shard), e.g. "
            f"{fits[:6]}"
        )
    if train.pipeline_schedule == "1f1b" and train.pipeline_repeats > 1 and m % stages:
        raise MeshConfigError(
            f"pipeline_microbatches={train.pipeline_microbatches} ({m} micro-batches) with "
            f"pipeline_schedule='1f1b' and pipeline_repeats={train.pipeline_repeats}: the "
            f"interleaved schedule runs micro-batches in groups of the {stages} stages "
            f"(timetable.py); accepted: a multiple of {stages}"
        )
    lead = kinds[: L - layers]
    return Stages(
        axis=axis,
        stages=stages,
        repeats=train.pipeline_repeats,
        microbatches=m,
        layers=layers,
        stack=kinds[-1],
        lead_dense=lead.count("layers"),
        lead_moe=lead.count("moe_layers"),
        # remat "none" checkpoints nothing, so there is no iteration to checkpoint either
        remat=train.pipeline_remat if train.remat != "none" else "layer",
        schedule=train.pipeline_schedule,
    )


def check_windows(model: ModelSpec, train: TrainSpec, layers: int) -> None:
    """The reference step's pipelined layers share one attention window: a stage runs its
    chunks' layers with one layer function (local layers' windows are static, cycle.py). The
    cost model prices pipelines of mixed windows; only the step refuses them."""
    L = model.num_layers
    if len({model.window(i) for i in range(L - layers, L)}) == 1:
        return
    one = [n for n in range(1, L + 1) if len({model.window(i) for i in range(L - n, L)}) == 1]
    raise MeshConfigError(
        f"pipeline_layers={train.pipeline_layers}: model {model.name!r}'s last {layers} layers "
        f"mix local layers (sliding_window={model.sliding_window}) and global ones "
        f"(global_every={model.global_every}), which the reference step's pipelined stages do "
        "not run yet (the cost model prices them); "
        f"accepted: a count of last layers that share one window (up to {max(one)}), or a "
        "model whose layers all slide (global_every=0)"
    )


def resolved(train: TrainSpec, st: Stages | None) -> TrainSpec:
    """`train` as the step runs it on these stages: the pipeline fields it left to defaults
    filled in (micro-batches, pipelined layers, where the stages checkpoint), so that a report
    says what it priced or compiled. Unchanged without stages."""
    if st is None:
        return train
    return replace(
        train,
        pipeline_microbatches=st.microbatches,
        pipeline_layers=st.layers,
        pipeline_remat=st.remat,
    )


def staged_shapes(shapes: Shapes, st: Stages) -> Shapes:
    """`shapes` (`layout.param_shapes`) with the pipelined layers of `st.stack` cut out into
    `stages/` weights [repeats, stages, per_chunk, ...], the stage dim's logical axis "stage"."""
    out: Shapes = {}
    prefix = st.stack + "/"
    for name, (shape, axes) in shapes.items():
        if not name.startswith(prefix):
            out[name] = (shape, axes)
            continue
        weight = name.removeprefix(prefix)
        if st.lead:
            out[name] = ((st.lead, *shape[1:]), axes)
        staged = (st.repeats, st.stages, st.per_chunk, *shape[1:])
        out[STAGED + weight] = (staged, (None, "stage", *axes))
    return out
