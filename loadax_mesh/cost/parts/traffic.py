"""The collectives the reference step runs over each mesh axis (what they cost:
timing/axes.py; what each is and the compiled programs that show it: docs/cost-terms.md).

Bytes are counted as the compiled program reports them (`CompileReport`): the full buffer over
the group (all-gather's result, reduce-scatter's input, the others' buffer), per device and
per step. What each role's axis carries:
- FSDP: every layer's weights gathered in the forward pass and again in the backward pass (on
  TPU a sequential layer's recomputed q, k and v weights a third time: `layout.regathered`),
  its weight gradients reduced, the embedding tables gathered and their gradients reduced,
  once per micro-batch (with logits chunks the unembedding again per chunk). MoE layers:
  `moe_collectives`; an expert axis acts as FSDP outside the experts.
- Expert: per MoE layer the all-to-alls that carry tokens to their experts and back.
- Data (a batch axis without an FSDP role): every gradient shard all-reduced once a step, one
  collective per weight array (`weight_arrays`), each paying the ring's latency across
  granules.
- Tensor (`model`): the residual stream is cut over it; per layer the norms' outputs gathered
  and the blocks' outputs reduce-scattered, forward, backward and recompute
  (`tensor_collectives`); outside the layers the lookup's and the final norm's.
- Sequence: per layer keys and values gathered along the sequence and their gradients
  reduce-scattered, or passed round it block by block (`seq_collectives`); the axis also
  shards the weights as FSDP does (`shard_axis`).
An axis with ICI and DCN factors runs each collective as an ICI phase then a DCN phase, each a
ring's time: (n - 1) / n of the bytes over the link, plus one latency per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...workload.layout import Roles, regathered, regathered_weights
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from . import mla
from .moe import exchange_bytes
from .shapes import Shapes, shard_bytes
from .weights import dense_layer_weights, moe_layer_weights


@dataclass(frozen=True)
class Collective:
    """One kind of collective over one axis: bytes per run, runs per step, and whether it can
    hide behind compute."""

    axis: str
    kind: str  # "all-gather", "reduce-scatter" or "all-reduce"
    what: str
    bytes: int
    count: int
    overlaps: bool


def collectives(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    *,
    overlapped: bool = False,
    regather: bool = False,
) -> list[Collective]:
    """Every collective the step runs, by axis (see the module's docstring); `overlapped`: the
    compiler overlaps tensor-parallel collectives with matmuls (libtpu's trait); `regather`: the
    step gathers the recomputed q, k and v weights again (`regathers_attention_weights`). With
    micro-batches each runs once per micro-batch: the weights are gathered again and each
    micro-batch's gradients are reduced as they come (the step differentiates one micro-batch
    at a time); activation collectives move a micro-batch's rows each time."""
    sh = Shapes.of(model, train, roles)
    cd = dtype_bytes(train.compute_dtype)
    m, L, d, M = roles.size("model"), model.num_layers, model.d_model, train.microbatches
    tables = (1 if model.tied_embeddings else 2) * sh.vocab * d * cd
    shard = model.num_params // (roles.size("weights") * m) * cd
    found: list[Collective] = []
    if model.num_experts:
        shard = shard_bytes(model, roles, cd, None)
    a = shard_axis(roles)
    if a is not None:
        found += (
            moe_collectives(model, train, roles, a, in_line=overlapped)
            if model.num_experts
            else layer_collectives(model, a, m, cd, L * M, in_line=overlapped)
        )
        qkv = regathered_weights(model, regathered(model, train, roles), m) * cd * regather
        if qkv:  # in line, as the attention's other gathers on TPU
            found.append(
                Collective(a, "all-gather", "q, k, v weights again", qkv, L * M, not overlapped)
            )
        found += [
            Collective(a, "all-gather", "embedding tables", tables, M, True),
            Collective(a, "reduce-scatter", "embedding gradients", tables, M, True),
        ]
        chunks = train.logits_chunks
        if chunks > 1:  # the loss's scan gathers the unembedding in every chunk, forward and
            # recompute, and reduces its gradient per chunk (measured: bench_cost)
            table, per_chunk, grads = sh.vocab * d * cd, (2 * chunks - 1) * M, (chunks - 1) * M
            found += [
                Collective(a, "all-gather", "unembedding per chunk", table, per_chunk, True),
                Collective(
                    a, "reduce-scatter", "unembedding gradient per chunk", table, grads, True
                ),
            ]
    for a in roles.data_parallel_axes():
        found += data_collectives(model, train, roles, a, shard)
    found += tensor_collectives(
        model, train, roles, layer_runs=L * M, head_runs=M, overlapped=overlapped
    )
    if model.num_experts:
        found += exchanges(model, train, roles)
    found += seq_collectives(model, train, roles, layer_runs=L * M)
    return found


def data_collectives(
    model: ModelSpec, train: TrainSpec, roles: Roles, a: str, shard: int
) -> list[Collective]:
    """A data axis's: every gradient shard (`shard` bytes of them) all-reduced, each layer
    weight's as it comes, once a micro-batch. Under ZeRO-1 (`optimizer_over_data`) reduced
    as pieces instead (reduce-scatter: each device keeps the part its optimizer updates), and
    the updated parameters gathered back once a step, after the update: nothing left to hide
    behind."""
    m, L, d, M = roles.size("model"), model.num_layers, model.d_model, train.microbatches
    cd, kind = dtype_bytes(train.compute_dtype), "all-reduce"
    k, rest = weight_arrays(model), 3 - int(model.tied_embeddings)  # tables, final norm
    tables = (rest - 1) * model.vocab_size * d // (roles.size("weights") * m)
    outside = (tables + d) * cd
    found: list[Collective] = []
    if train.optimizer_over_data:
        kind, pd = "reduce-scatter", dtype_bytes(train.param_dtype)
        params = shard * pd // cd
        found.append(Collective(a, "all-gather", "updated parameters", params, 1, False))
    return [
        Collective(a, kind, "layer weight gradients", (shard - outside) // (L * k), L * k * M,
                   True),
        Collective(a, kind, "table and norm gradients", outside // rest, rest * M, True),
        *found,
    ]  # fmt: skip


def tensor_collectives(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    *,
    layer_runs: int,
    head_runs: int,
    overlapped: bool,
) -> list[Collective]:
    """The tensor axis's activation collectives (the module's docstring): a layer's, `layer_runs`
    times (layer passes times micro-batches), and those outside the layers (the lookup, the
    final norm's output and its gradient), `head_runs` times; each moves a micro-batch's rows of
    `train` on these roles. A pipeline stage's layer passes and the step's head are priced
    apart (cost/pipeline/stages.py)."""
    t, m = roles.model, roles.size("model")
    if t is None or m == 1:
        return []
    sh, cd, placed = (
        Shapes.of(model, train, roles),
        dtype_bytes(train.compute_dtype),
        train.placements,
    )
    activation = sh.micro_rows * sh.seq * model.d_model * cd
    # A second forward pass of the attention half (its output projection recomputed); the
    # norms' outputs gathered again to recompute the projections that read them.
    again = int(placed["out_proj"] == "recompute")
    norms_again = int("recompute" in (placed["query"], placed["key"], placed["value"]))
    norms_again += int(placed["mlp_in"] == "recompute")
    if model.parallel_block:
        gathers, reductions, hidden = _parallel_block_runs(placed, 1, overlapped=overlapped)
    else:
        gathers, reductions = 2 + 6 + norms_again, 2 + 2 + again
        # Overlapped (libtpu): the backward pass's gathers but one that regathers a norm's
        # output (the recompute's, or for the weight gradients), and one reduce-scatter of
        # each pass (a windowed matmul); the rest wait.
        hidden = (6 + norms_again - max(norms_again, 1), 2) if overlapped else (0, 0)
    found = [
        Collective(t, "all-gather", "hidden-cut activations", activation,
                   (gathers - hidden[0]) * layer_runs + 3 * head_runs, False),
        Collective(t, "reduce-scatter", "block outputs and gradients", activation,
                   (reductions - hidden[1]) * layer_runs + head_runs, False),
        Collective(t, "all-reduce", "embedding lookup", activation, head_runs, False),
    ]  # fmt: skip
    if overlapped:
        found += [
            Collective(t, "all-gather", "backward gathers beside matmuls", activation,
                       hidden[0] * layer_runs, True),
            Collective(t, "reduce-scatter", "windowed-matmul reductions", activation,
                       hidden[1] * layer_runs, True),
        ]  # fmt: skip
    if model.attention == "mla":  # the bottlenecks' gradients, partial over the heads
        ranks = sh.micro_rows * sh.seq * (model.q_lora_rank + model.kv_lora_rank) * cd
        found.append(Collective(t, "all-reduce", "latent gradients", ranks, layer_runs, False))
    return found


def seq_collectives(
    model: ModelSpec, train: TrainSpec, roles: Roles, *, layer_runs: int
) -> list[Collective]:
    """The sequence axis's attention collectives, per layer pass (`layer_runs`: passes times
    micro-batches), each on a micro-batch's keys and values (again for a recompute that needs
    them), by `TrainSpec.context_strategy`: "all_gather" gathers them whole and
    reduce-scatters their gradients, the attention waiting on both; "ring" (workload/ring.py)
    passes each device's block to the next c - 1 times forward (again where a checkpoint
    reruns the attention), and backward c - 1 times again with its float32 gradient
    accumulators c times, each hop beside the attention of the block in hand (hidden up to
    the compute)."""
    s, c = roles.seq, roles.size("seq")
    if s is None or c == 1 or not layer_runs:
        return []
    sh, placed = Shapes.of(model, train, roles), train.placements
    kv_again = int("recompute" in (placed["key"], placed["value"]))  # recomputed for the kernel
    v_dim = model.v_head_dim if model.attention == "mla" else model.head_dim
    cd = dtype_bytes(train.compute_dtype)
    kv = sh.micro_rows * model.seq_len * sh.kv_heads * (model.head_dim + v_dim) * cd
    if train.context_strategy == "ring":
        block, again = kv // c, int(train.remat != "none")
        return [
            Collective(s, "collective-permute", "key and value blocks round the ring", block,
                       (c - 1) * (2 + again) * layer_runs, True),
            Collective(s, "collective-permute", "float32 key and value gradient blocks",
                       block * 4 // cd, c * layer_runs, True),
        ]  # fmt: skip
    return [
        Collective(s, "all-gather", "keys and values", kv, (1 + kv_again) * layer_runs, False),
        Collective(s, "reduce-scatter", "key and value gradients", kv, layer_runs, False),
    ]


def layer_collectives(
    model: ModelSpec, a: str, m: int, cd: int, runs: int, *, in_line: bool
) -> list[Collective]:
    """A dense layer's FSDP collectives over axis `a`, `runs` times (layers x micro-batches):
    its weights gathered forward and backward, its gradients reduce-scattered, all beside the
    compute; `in_line` (libtpu) the attention block's weights (q, k, v, output) gathered in
    line each pass, the MLP's beside matmuls (benchmarks/probes/probe_fsdp_schedule.py)."""
    layer = dense_layer_weights(model, m) * cd
    gradients = Collective(a, "reduce-scatter", "layer weight gradients", layer, runs, True)
    if not in_line:
        return [Collective(a, "all-gather", "layer weights", layer, 2 * runs, True), gradients]
    attention = mla.attention_weights(model, m) * cd
    return [
        Collective(a, "all-gather", "attention weights", attention, 2 * runs, False),
        Collective(a, "all-gather", "MLP weights", layer - attention, 2 * runs, True),
        gradients,
    ]


def _parallel_block_runs(
    placed: dict[str, str], layers: int, *, overlapped: bool
) -> tuple[int, int, tuple[int, int]]:
    """A parallel block's tensor-parallel activation collectives over `layers` layers:
    (gathers, reduce-scatters, (of which hidden gathers, hidden reduce-scatters)), as the
    scheduled HLO of a tensor-16 step shows them (benchmarks/probes/probe_overlap.py --parallel, 2
    layers, full and dots remat). Forward: the norm's output gathered once for both halves,
    the halves' outputs reduced one by one (one as a windowed matmul); the output projection
    is never recomputed. Backward: two gathers without a recompute (both wait: the output's
    gradient, once for both halves, and the norm's output for the weight gradients), five where
    the projections reading the norm are recomputed (four of them async beside matmuls); the
    gradient of the norm's output reduced twice, the attention's three partial sums together
    and the MLP's as a windowed matmul. Without overlap (GPU; not compiled there) all wait."""
    recompute = "recompute" in (placed["query"], placed["key"], placed["value"], placed["mlp_in"])
    backward = (1 + 4) if recompute else 2
    gathers, reductions = layers * (1 + backward), layers * (2 + 2)
    hidden = (layers * 4 * recompute, 2 * layers) if overlapped else (0, 0)
    return gathers, reductions, hidden


def weight_arrays(model: ModelSpec) -> int:
    """The weight arrays of a layer whose gradients are reduced one by one: query, key, value,
    output, the MLP's two (a two-matrix MLP) or three (SwiGLU; a MoE layer's routed experts
    and the router instead, and the shared experts' three), and the norms' scales together."""
    mlp = 3 if model.mlp == "swiglu" else 2
    if model.num_experts:
        mlp = 1 + 3 + 3 * bool(model.num_shared_experts)
    return 4 + mlp + 1


def shard_axis(roles: Roles) -> str | None:
    """The axis the weights' FSDP collectives are counted on: fsdp, else the sequence axis
    (it shards the weights as fsdp does), else the expert axis where it acts as FSDP alone
    (a collective spanning several is counted on the first)."""
    for role in ("fsdp", "seq", "expert"):
        if roles.size(role) > 1:
            return getattr(roles, role)
    return None


def weights_axis(roles: Roles) -> str | None:
    """The axis the routed experts' weight collectives are counted on: fsdp, else the sequence
    axis (their d_model is cut over both); None where neither shards them."""
    return next((getattr(roles, r) for r in ("fsdp", "seq") if roles.size(r) > 1), None)


def moe_collectives(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    a: str,
    *,
    in_line: bool = False,
    runs: tuple[int, int] | None = None,
) -> list[Collective]:
    """The layers' weight collectives of a model with MoE layers, on the shard axis `a`: as
    a dense model's (gathered forward and backward, gradients reduce-scattered, per
    micro-batch) for its dense layers and for a MoE layer's attention, router and shared
    experts (gathered over fsdp and the expert axis together); its routed experts gathered over
    fsdp alone (moe.py's `gathers`: their d_model, the E / P experts of an expert axis of size P
    or all E without one), none where fsdp has size 1. `in_line` (libtpu): every layer's
    attention weights gathered in line, as a dense layer's (`layer_collectives`). `runs`: the
    passes of (dense, MoE) layers, micro-batches included (None: the model's layers, once per
    micro-batch; a pipeline's stages run theirs every iteration, cost/pipeline/stages.py)."""
    cd, M = dtype_bytes(train.compute_dtype), train.microbatches
    moe_layers = model.num_moe_layers
    dense, moe = runs or ((model.num_layers - moe_layers) * M, moe_layers * M)
    shared, experts = (w * cd for w in moe_layer_weights(model, roles))
    attention = mla.attention_weights(model, roles.size("model")) * cd if in_line else 0
    found = []
    if in_line:
        passes = 2 * (dense + moe)
        found.append(Collective(a, "all-gather", "attention weights", attention, passes, False))
    if dense:
        layer = dense_layer_weights(model, roles.size("model")) * cd
        found += [
            Collective(a, "all-gather", "dense layer weights", layer - attention, 2 * dense,
                       True),
            Collective(a, "reduce-scatter", "dense layer gradients", layer, dense, True),
        ]  # fmt: skip
    found += [
        Collective(a, "all-gather", "MoE layer weights", shared - attention, 2 * moe, True),
        Collective(a, "reduce-scatter", "MoE layer gradients", shared, moe, True),
    ]
    f = weights_axis(roles)
    if f is not None:
        found += [
            Collective(f, "all-gather", "expert weights", experts, 2 * moe, True),
            Collective(f, "reduce-scatter", "expert gradients", experts, moe, True),
        ]
    return [c for c in found if c.count]


def exchanges(
    model: ModelSpec, train: TrainSpec, roles: Roles, *, layer_runs: int | None = None
) -> list[Collective]:
    """The all-to-alls over the expert axis (moe.py's `_exchange`), per MoE layer and
    micro-batch: the tokens dispatched and their results combined, forward; the two gradients
    exchanged back, backward; under any remat policy the forward's pair again, recomputed for
    the experts' weight gradients (the block's intermediates carry no checkpoint name). The
    dropless path also sends an int32 expert id a row, forward and recomputed. They feed the
    experts: exposed. `layer_runs`: MoE layer passes, micro-batches included (None: the
    model's MoE layers once per micro-batch), each on a micro-batch's rows of `train`."""
    runs = model.num_moe_layers * train.microbatches if layer_runs is None else layer_runs
    if not runs or roles.expert is None:
        return []
    tokens, ids = exchange_bytes(model, train, roles)
    if not tokens:
        return []
    again = int(train.remat != "none")
    found = [
        Collective(roles.expert, "all-to-all", "tokens and results", tokens,
                   (4 + 2 * again) * runs, False),
    ]  # fmt: skip
    if ids:
        found.append(
            Collective(roles.expert, "all-to-all", "expert ids", ids, (1 + again) * runs, False)
        )
    return found
