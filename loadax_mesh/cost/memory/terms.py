"""Memory per device of the reference step, term by term, and its peak; and the bytes the
recipe offloads to host memory.

The step holds its arguments for the whole step (parameters and Adam's moments, donated so
the updated ones reuse them; the batch) and, on top, what the phase it is in needs. Three phases
can set the peak: the head of the backward pass (saved layer inputs, every gradient shard, the
logits and their gradient, a gathered embedding table and its gradient), the layer loop (saved
inputs, every gradient shard and, on TPU across data-parallel axes, their compute-dtype copy; one
layer's weights gathered, twice for prefetch and once as their gradient before it is reduced;
its intermediates, recomputed under full remat, and their gradients; on TPU the splash kernel's
float32 buffers among them) and the tail (gradient shards, a table and its gradient). The
largest is the peak. On TPU every array is stored in whole memory tiles.

The recipe (TrainSpec): each named tensor of a layer is saved on the device, offloaded to host
memory, or recomputed in the backward pass; with `microbatches` M every per-row tensor (saved
activations, a layer's intermediates, the logits) is that of one micro-batch, 1/M of the rows,
and a float32 accumulator of the gradient shards is held beside them; with `logits_chunks` C the
logits and their gradient exist one chunk at a time, 1/C of them. A quantized step
(`quantization`) also holds, in the layer loop, one layer's quantized copies (`_quantized`).
"""

from __future__ import annotations

from functools import lru_cache, partial

from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..parts.cache import plain_cache
from ..parts.quantized import quantized
from ..parts.shapes import Shapes, optimizer_bytes, shard_bytes, stored
from ..parts.sublayer import counted_per_sublayer
from ..parts.weights import dense_layer_weights, moe_layer_weights
from .layer import layer_bytes, working_bytes


@plain_cache(maxsize=65536, copy=True)
def memory_terms(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    device: DeviceFacts,
    *,
    replicas_across_granules: bool = False,
) -> dict[str, int]:
    """Every device term in bytes per device of `device`'s hardware; `phases` says which of
    them are live at once. Where a data-parallel axis spans TPU slices, the embedding tables'
    gradients wait for the reduction across slices (the hosts' megascale transfers, at the
    end of the step): the tail holds both tables and both gradients, or the one table and
    its gradient when tied (`replicas_across_granules`; GPUs reduce across hosts as they go)."""
    tile, kernel = device.tile, attention_kernel(train.attention, device.platform)
    held = device.traits.holds_reduced_gradients
    terms = dict(_fixed_terms(model, _dtypes(train), roles, tile, held, replicas_across_granules))
    sh = Shapes.of(model, train, roles)
    cd = dtype_bytes(train.compute_dtype)
    traits = device.traits
    logits = 2 * stored((sh.micro_rows, sh.seq, sh.vocab), cd, tile)
    saved = partial(layer_bytes, model, train, sh, roles, tile, kernel, saved=True)
    L, moe = model.num_layers, model.num_moe_layers
    dense = L - moe
    activations = dense * saved() + moe * saved(moe=True) if model.num_experts else L * saved()
    layer = layer_term(model, train, roles, device)
    if traits.fuses_unlooped_gradients and model.num_layers == 1 == train.microbatches:
        terms["gradients"] = 0  # no layer loop: each gradient fused into its update
    logits = -(-logits // train.logits_chunks)
    return terms | {
        "batch": _batch_bytes(sh, tile),
        "activations": activations,
        "logits": logits,
        # the logits' gradient (half the term) and one table's gradient, where the tables'
        # gradients are reduced across devices
        "head gradients": (logits // 2 + terms["embeddings"] // 2)
        * (traits.holds_head_gradients_in_loop and roles.size("batch") * roles.size("seq") > 1),
        "attention bias": _attention_bias(model, train, sh, roles, tile, kernel),
        # Gradient accumulation: the running sum of every gradient shard, in float32.
        "accumulator": shard_bytes(model, roles, 4, tile) * (train.microbatches > 1),
        "layer": layer,
        "expert stacks": _expert_stacks(model, roles, train.param_dtype) * traits.relayouts_experts,
        **_quantized(model, train, roles),
    }


def _attention_bias(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
) -> int:
    """cuDNN over a split sequence (all_gather) takes its mask from positions as a bias
    [1, 1, queries, keys] in the compute dtype (workload/attention.py `_fused`): the backward
    pass's recomputed bias is live at the layer loop's peak (2 GiB of LLaMA-3 8B's at 64k over
    seq 4, 8 GiB at 128k, compile-only H100s). Ring attention and the other kernels take none."""
    split = roles.size("seq") > 1 and train.context_strategy == "all_gather"
    if kernel != "cudnn" or not split:
        return 0
    return stored((1, 1, sh.seq, model.seq_len), dtype_bytes(train.compute_dtype), tile)


def _quantized(model: ModelSpec, train: TrainSpec, roles: Roles) -> dict[str, int]:
    """A quantized step's 1-byte copies in the layer loop (parts/quantized.py), of the larger
    kind of layer: a layer's backward pass holds the quantized weights and inputs its forward
    made (its matmuls' gradients read them) and one output gradient quantized at a time, the
    widest; none unquantized (no term)."""
    if train.quantization == "none":
        return {}
    moe = model.num_moe_layers
    kinds = [quantized(model, train, roles, moe=True)] if moe else []
    if model.num_layers > moe:
        kinds.append(quantized(model, train, roles))
    return {"quantized": max(q.forward + q.widest for q in kinds)}


@plain_cache(maxsize=65536)
def layer_term(model: ModelSpec, train: TrainSpec, roles: Roles, device: DeviceFacts) -> int:
    """memory_terms's "layer": one layer's weights gathered and its backward pass's working
    set, of the larger kind of layer (a pipeline stage's step reads it alone)."""
    tile, kernel = device.tile, attention_kernel(train.attention, device.platform)
    sh, traits = Shapes.of(model, train, roles), device.traits
    cd = dtype_bytes(train.compute_dtype)
    if model.num_experts:
        experts_held = 1 + (not traits.sublayer_weights)  # GPU: their gradients beside them
        return _moe_layer(model, train, sh, roles, tile, kernel, experts_held)
    per_sublayer = counted_per_sublayer(train, traits, roles.size("model"))
    weights = dense_layer_weights(model, roles.size("model")) * cd
    regather = traits.regathers_attention_weights
    work = partial(working_bytes, model, train, sh, roles, tile, kernel, regather=regather)
    whole = not (per_sublayer and traits.sublayer_weights)
    return 3 * weights * whole + work(per_sublayer=per_sublayer, sublayer_weights=not whole)


def _moe_layer(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
    experts_held: int,
) -> int:
    """A model with MoE layers: the larger of its two kinds' layer-loop terms, one layer's
    weights gathered and its backward pass's working set. A dense layer's weights count three
    times (see memory_terms); a MoE layer's attention, router and shared experts twice: the
    compiler prefetches no next layer's past the block's shard_map, so its backward pass holds
    them and their gradient before it is reduced. Its routed experts, as cost/parts/moe.py
    gathers them, count `experts_held` times: on TPU once, each matrix's gradient leaving as
    the backward produces it (the compiled v5p-16 steps of benchmarks/bench_cost.py's MoE
    cases, and DeepSeek-V3 at full width on v5p-1024, where the 22.5 GB of experts gathered
    counted twice overstate libtpu's assignment by half:
    docs/notes/2026-11-26-deepseek-v3-latent-attention.md); on GPU twice, the three gradients
    whole beside the three gathered matrices at the backward pass's peak (XLA's heap, Mixtral
    8x7B over fsdp 8 compiled for H200s)."""
    cd = dtype_bytes(train.compute_dtype)
    dense = model.num_layers - model.num_moe_layers
    work = partial(working_bytes, model, train, sh, roles, tile, kernel)
    shared, experts = moe_layer_weights(model, roles)
    layer = (2 * shared + experts_held * experts) * cd + work(moe=True)
    if dense:
        weights = dense_layer_weights(model, roles.size("model")) * cd
        layer = max(layer, 3 * weights + work())
    return layer


def _expert_stacks(model: ModelSpec, roles: Roles, param_dtype: str) -> int:
    """The routed experts' stacked parameters of one device, in the parameter dtype: what XLA's
    GPU compiler lays out a second time for the whole step where fsdp shards their d_model
    (`PlatformTraits.relayouts_experts`); nothing without an fsdp axis to gather over."""
    fsdp = roles.size("weights")
    if not model.num_experts or fsdp == 1:
        return 0
    return (
        model.num_moe_layers * moe_layer_weights(model, roles)[1] // fsdp * dtype_bytes(param_dtype)
    )


def host_bytes(model: ModelSpec, train: TrainSpec, roles: Roles, device: DeviceFacts) -> int:
    """Bytes per device the recipe offloads to host memory: the offloaded tensors of every
    layer (of one micro-batch: each micro-batch's backward pass reads them back before the next
    one's forward pass writes them), as the device stores them."""
    if "offload" not in train.placements.values():
        return 0
    sh = Shapes.of(model, train, roles)
    kernel = attention_kernel(train.attention, device.platform)
    saved = partial(layer_bytes, model, train, sh, roles, device.tile, kernel, saved=True)
    moe = model.num_moe_layers
    if not moe:
        return model.num_layers * saved(where="offload")
    return (model.num_layers - moe) * saved(where="offload") + moe * saved(
        where="offload", moe=True
    )


def _dtypes(train: TrainSpec) -> tuple[str, str, str, bool]:
    """What the fixed terms read of the recipe: the three dtypes and ZeRO-1."""
    return train.param_dtype, train.opt_state_dtype, train.compute_dtype, train.optimizer_over_data


@lru_cache(maxsize=4096)
def _fixed_terms(
    model: ModelSpec,
    dtypes: tuple[str, str, str, bool],
    roles: Roles,
    tile: tuple[int, int] | None,
    holds_reduced: bool,
    held_tables: bool,
) -> tuple[tuple[str, int], ...]:
    """The terms the recipe does not change: parameters, optimizer state (cut over data too
    under ZeRO-1), gradients, tables."""
    pd, od, cd = (dtype_bytes(x) for x in dtypes[:3])
    moment = (optimizer_bytes if dtypes[3] else shard_bytes)(model, roles, od, tile)
    table = stored((model.vocab_size // roles.size("model"), model.d_model), cd, tile)
    return (
        ("params", shard_bytes(model, roles, pd, tile)),
        ("optimizer", 2 * moment),
        ("gradients", shard_bytes(model, roles, pd, tile)),
        # Across data-parallel axes the gradient shards are reduced in the compute dtype. TPU
        # reduces them after the layer loop: a second set, stacked over the layers like the
        # float32 one. XLA's GPU pipeline reduces each layer's shards inside the loop (a bf16
        # all-reduce per layer in the loop body), so no stacked set is held there.
        ("reduced gradients", shard_bytes(model, roles, cd, tile) * _dp(roles) * holds_reduced),
        # The gathered unembedding and its gradient (tied: the one table and its gradient).
        ("embeddings", 2 * table),
        # Untied, where the tables' gradients wait for the reduction across slices: the input
        # table and its gradient as well, at the end of the step only (the input table's
        # gradient exists once the backward layer loop is done).
        ("held tables", 2 * table * (held_tables and not model.tied_embeddings)),
    )


def _batch_bytes(sh: Shapes, tile: tuple[int, int] | None) -> int:
    """The batch's inputs and targets (int32)."""
    return 2 * stored((sh.rows, sh.seq), 4, tile)


def memory_floor(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    device: DeviceFacts,
    *,
    replicas_across_granules: bool = False,
) -> int:
    """A lower bound of every recipe's peak (memory_terms's, as `phases` finds it): the tail
    phase's terms that no recipe changes (arguments, gradient shards and their reduced copy,
    the tables), the accumulator left out; the peak is the largest phase's total."""
    held = device.traits.holds_reduced_gradients
    fixed = _fixed_terms(model, _dtypes(train), roles, device.tile, held, replicas_across_granules)
    terms = dict(fixed)
    terms["batch"] = _batch_bytes(Shapes.of(model, train, roles), device.tile)
    return sum(v for k, v in terms.items() if "tail" in TERMS[k])


# Every memory term, declared once with the phases of the step it is live in. A phase's total is
# its terms' sum and the largest phase is the peak; a term declared nowhere is an error in
# `phases`, never silently left out of the peak.
PHASES = ("backward head", "layer loop", "tail")
WHOLE_STEP = PHASES
TERMS: dict[str, tuple[str, ...]] = {
    # the step's arguments (donated: the updated ones reuse them), and the gradient shards
    "params": WHOLE_STEP,
    "optimizer": WHOLE_STEP,
    "batch": WHOLE_STEP,
    "expert stacks": WHOLE_STEP,
    "gradients": WHOLE_STEP,
    "accumulator": WHOLE_STEP,
    "activations": ("backward head", "layer loop"),
    "logits": ("backward head",),
    "embeddings": ("backward head", "tail"),
    "reduced gradients": ("layer loop", "tail"),
    "layer": ("layer loop",),
    "head gradients": ("layer loop",),
    "attention bias": ("layer loop",),
    "quantized": ("layer loop",),
    "held tables": ("tail",),
    # a pipelined step's own (cost/pipeline/memory.py)
    "pipeline buffers": ("layer loop",),
    "stage weights": ("layer loop",),
    "chunk residuals": ("layer loop",),
    "kept logits": ("layer loop",),
    "iteration residuals": ("layer loop",),
}


def phases(terms: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """Each phase's total, and the terms live in the largest (`TERMS` says where each is live)."""
    if not terms.keys() <= TERMS.keys():
        undeclared = sorted(set(terms) - set(TERMS))
        raise LookupError(f"memory terms {undeclared} are declared in no phase (memory/terms.py)")
    totals = dict.fromkeys(WHOLE_STEP, 0)
    for name, nbytes in terms.items():
        for phase in TERMS[name]:
            totals[phase] += nbytes
    worst = max(totals, key=lambda name: totals[name])
    return totals, {k for k in terms if worst in TERMS[k]}


def _dp(roles: Roles) -> int:
    """1 where the step has data-parallel axes (it reduces gradients in the compute dtype)."""
    return int(bool(roles.data_parallel_axes()))
