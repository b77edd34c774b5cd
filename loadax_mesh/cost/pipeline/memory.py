"""The memory of a pipelined step: memory/terms.py's terms, a stage's (what each holds and the
compiled steps that referee it: docs/cost-terms.md, "Pipeline stages")."""

from __future__ import annotations

from functools import lru_cache, partial

from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ...workload.stages import Stages
from ...workload.timetable import one_f_one_b
from ..memory.layer import layer_bytes, unrolled_bytes
from ..memory.terms import layer_term, memory_terms
from ..parts.shapes import Shapes, stored
from .stages import data_roles, layout, moe_stages, shard_elements, stage_train


def pipeline_memory_terms(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    device: DeviceFacts,
    *,
    replicas_across_granules: bool = False,
) -> dict[str, int]:
    """`_terms`, found once (as memory/terms.memory_terms is: the chooser asks for each
    recipe's on every search), each caller its own copy."""
    return dict(_terms(model, train, r, st, device, replicas_across_granules))


@lru_cache(maxsize=16384)
def _terms(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    device: DeviceFacts,
    replicas_across_granules: bool,
) -> dict[str, int]:
    """memory/terms.memory_terms for a pipelined step: the terms outside the
    stages as a plain step's with the pipeline axis acting as data, the arguments a stage's,
    the activations every iteration's chunk and the lead layers', the layer term the larger
    of a stage's layer and a lead layer, and the pipelined step's own terms of the layer
    loop's phase ("pipeline buffers", "stage weights", "chunk residuals", "kept logits",
    "iteration residuals")."""
    rd, ts = data_roles(r), stage_train(train, st)
    tile = device.tile
    kernel = attention_kernel(train.attention, device.platform)
    outer = memory_terms(
        model, train, rd, device, replicas_across_granules=replicas_across_granules
    )
    held = _held(model, train, r, st, device, outer)
    saved = partial(layer_bytes, model, saved=True, tile=tile, kernel=kernel)
    lead = st.lead_dense + st.lead_moe
    moe = bool(moe_stages(st))  # a MoE layer's saved tensors: its block's (layer_memory.py)
    stage_sh = Shapes.of(model, ts, r)
    kept_stage = st.per_chunk * st.iterations * saved(ts, stage_sh, r, moe=moe)
    sh = Shapes.of(model, train, rd)
    kept = kept_stage + (st.lead_dense and st.lead_dense * saved(train, sh, rd))
    kept += st.lead_moe and st.lead_moe * saved(train, sh, rd, moe=True)
    sh, hidden = Shapes.of(model, train, r), model.d_model // r.size("model")
    cd = dtype_bytes(train.compute_dtype)

    terms = outer | {
        "params": held["params"],
        "optimizer": held["optimizer"],
        "gradients": held["gradients"],
        "reduced gradients": held["reduced gradients"],
        "batch": held["batch"],
        "activations": kept,
        "accumulator": held["accumulator"],
        "layer": max(layer_term(model, ts, r, device), outer["layer"] if lead else 0),
        # While the stages run: the micro-batches and the results in the compute dtype (the
        # hidden dim cut over the tensor axis, as the step's activations); their float32
        # copies at the shard_map's edge are not live then.
        "pipeline buffers": 2 * stored((sh.micro_rows, sh.seq, hidden), cd, tile),
        "stage weights": held["stage weights"],
        # ... and copies out one iteration's saved chunk, per_chunk layers of one micro-batch.
        "chunk residuals": kept_stage // st.iterations,
        # The forward pass's logits, which the compiled steps keep until the unembedding's
        # gradient is taken after the stages' backward pass; beside a sequence axis they take
        # it before (two compiles: only the unembedding's gradient shard stays).
        "kept logits": outer["logits"] // 2 * (r.size("seq") == 1),
        "head gradients": 0,  # the pipelined step's head is priced by "kept logits"
        # One checkpoint an iteration (pipeline_remat "iteration", MaxText's): the backward
        # pass of a chunk recomputes all its layers before it differentiates them, so beside
        # the layer being differentiated the other per_chunk - 1 hold what they keep for it.
        "iteration residuals": (st.per_chunk - 1)
        * unrolled_bytes(model, ts, stage_sh, r, tile, kernel, moe=moe)
        * (st.remat == "iteration"),
        "expert stacks": held["expert stacks"],
    }
    if st.schedule == "gpipe":
        return terms
    item = stored((stage_sh.micro_rows, stage_sh.seq, hidden), cd, tile)  # a stage input
    head = memory_terms(model, ts, r, device)["logits"]  # the head's, on a stage's micro-batch
    weights = (held["chunk weights"], held["staged float32"])
    return terms | _one_f_one_b(st, terms, head, item, kept - kept_stage, weights)


@lru_cache(maxsize=4096)
def in_flight(stages: int, repeats: int, microbatches: int) -> int:
    """The buffer of items a 1F1B stage keeps (workload/timetable.py: its most, plus the slot
    an idle tick writes to)."""
    return one_f_one_b(stages, repeats, microbatches).slots + 1


def _one_f_one_b(
    st: Stages,
    terms: dict[str, int],
    head: int,
    item: int,
    lead: int,
    weights: tuple[int, int],
) -> dict[str, int]:
    """The terms the 1F1B schedule changes (workload/pipeline_1f1b.py): a stage keeps the
    inputs of the items in flight, not of every iteration (each layer's under pipeline_remat
    "layer", the chunk's under "iteration"; `item` one such input, `lead` the lead layers'
    activations), sums its chunks' weight gradients in float32 beside a chunk of its weights
    in the compute dtype (`weights`: those two), and runs the head in the loop on a stage's
    micro-batch and its slice of the vocabulary (`head` the micro-batch's whole logits): they,
    the gathered table's slice and the table's gradient live there, and there is no backward
    head over the whole rows."""
    per_item = item * (st.per_chunk if st.remat == "layer" else 1)
    kept = in_flight(st.stages, st.repeats, st.microbatches) * per_item
    table = terms["embeddings"] // 2  # the gathered table; its gradient the other half
    return {
        "activations": kept + lead,
        "chunk residuals": per_item,
        "stage weights": sum(weights),
        "logits": 0,
        # The logits and the gathered table a stage's slice of them; the table's gradient half
        # of "embeddings" whole: tpu-v5p-128's 1F1B program saved 0.70 GB when the vocabulary
        # was cut four ways, where cutting both halves would save 0.99 (which buffer keeps the
        # gradient whole is not identified; docs/notes/2026-12-07-1f1b-head.md).
        "kept logits": -(-(head + table) // st.stages) + table,
    }


def _held(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    device: DeviceFacts,
    outer: dict[str, int],
) -> dict[str, int]:
    """The terms of `pipeline_memory_terms` that a stage holds whatever its layers save: its
    arguments (the parameters, optimizer state, gradient shards and their reduced copy in the
    stage layout, the batch, GPU's expert stacks), the gradient accumulator and a chunk of
    stage weights; `outer` the plain step's terms with the pipeline axis acting as data.
    Found once per layout and dtypes (`_arguments`): the caller only reads them."""
    sh = Shapes.of(model, train, r)
    dtypes = (train.param_dtype, train.opt_state_dtype, train.compute_dtype,
              train.optimizer_over_data)  # fmt: skip
    found = (bool(outer["gradients"]), bool(outer["reduced gradients"]), outer["expert stacks"])
    many = train.microbatches > 1
    return _arguments(model, r, layout(st), device.tile, dtypes, many, (sh.rows, sh.seq), found)


@lru_cache(maxsize=4096)
def _arguments(
    model: ModelSpec,
    r: Roles,
    st: Stages,
    tile: tuple[int, int] | None,
    dtypes: tuple[str, str, str, bool],
    accumulates: bool,
    batch: tuple[int, int],
    outer: tuple[bool, bool, int],
) -> dict[str, int]:
    """`_held` on a stage layout `st`: `dtypes` the parameters', optimizer state's and compute
    dtype and ZeRO-1, `batch` a device's (rows, sequence slice), `outer` whether the plain step
    holds gradient shards and a reduced copy, and its expert stacks."""
    pd, od, cd = (dtype_bytes(x) for x in dtypes[:3])
    shard = partial(shard_elements, model, st, r, tile=tile)
    gradients, reduced_held, stacks = outer

    def chunk(nbytes: int) -> int:  # one chunk of a stage's weights (of its R)
        return shard(nbytes, staged=True) // st.repeats

    # Reduced in the compute dtype across data-parallel axes (memory.py): with a data axis
    # every gradient; else only those the pipeline axis replicates (tables, norm, lead layers).
    reduced = shard(cd, staged=None if r.data_parallel_axes() else False)
    stage_moe = st.lead_moe + st.layers // st.stages * bool(moe_stages(st))
    return {
        "params": shard(pd),
        "optimizer": 2 * shard(od, optimizer=dtypes[3]),
        "gradients": shard(pd) if gradients else 0,
        "reduced gradients": reduced * reduced_held,
        "batch": 2 * stored(batch, 4, tile),
        "accumulator": shard(4) * accumulates,
        # The backward pass of an iteration picks its chunk of the stage's weights again in
        # the compute dtype (the layer picks them inside its checkpoint, so the scan saves
        # none) and holds that chunk's float32 gradient beside their running sum (the
        # buffer assignments of bench_cost's pipelined cases:
        # docs/notes/2026-11-29-pipeline-stages-priced.md).
        "stage weights": chunk(cd) + chunk(4),
        # 1F1B's: a chunk of weights in the compute dtype, the gradient sum of all its chunks
        "chunk weights": chunk(cd),
        "staged float32": shard(4, staged=True),
        # GPU's second layout of the routed experts: a stage's MoE layers' and the lead ones'
        "expert stacks": stacks * stage_moe // max(model.num_moe_layers, 1),
    }


# The terms of a pipelined step that no recipe changes and that both the layer loop and the
# tail hold (memory/terms.py's TERMS): the arguments, the gradient shards and their reduced copy
FLOOR = ("params", "optimizer", "batch", "expert stacks", "gradients", "reduced gradients")


def pipeline_memory_floor(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    st: Stages,
    device: DeviceFacts,
    *,
    replicas_across_granules: bool = False,
) -> int:
    """A lower bound of the peak of every recipe on these stages' layout (S stages of R
    chunks; memory.memory_floor's for a pipelined step): the arguments, the gradient shards
    and their reduced copy, and the larger of what the tail adds (the tables) and what the
    layer loop adds that no recipe changes (a chunk of stage weights). The recipe (its
    micro-batches, remat, logits chunks, MoE path and pipeline micro-batches) changes only
    the other terms, so `train` may be any recipe on this layout."""
    outer = memory_terms(
        model, train, data_roles(r), device, replicas_across_granules=replicas_across_granules
    )
    terms = outer | _held(model, train, r, st, device, outer)
    fixed = sum(terms.get(k, 0) for k in FLOOR)
    return fixed + max(terms["embeddings"] + terms["held tables"], terms["stage weights"])
