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
logits and their gradient exist one chunk at a time, 1/C of them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache, partial

from ..hardware.profile import DeviceFacts, attention_kernel
from ..workload.layout import Roles, regathered, splash_blocks
from ..workload.spec import ModelSpec, TrainSpec, dtype_bytes
from . import mla
from .moe import MOE_NAMES, dense_layer_weights, moe_intermediates, moe_layer_weights
from .saved import PARTS, kept, recomputed
from .stored import Shapes, shard_bytes, stored
from .sublayer import counted_per_sublayer, recomputed_working


def layer_weights(model: ModelSpec, m: int) -> int:
    """One layer's weights on one device once gathered over FSDP (elements)."""
    return mla.attention_weights(model, m) + model.mlp_params(model.d_ff) // m


@lru_cache(maxsize=1024)
def _shape_only(train: TrainSpec) -> TrainSpec:
    """`train` with the fields a layer's intermediates do not depend on (the remat and the
    logits chunks) at one value, so that what is priced once is found for every recipe."""
    return replace(train, remat="full", logits_chunks=1)


def _intermediates(
    model: ModelSpec, train: TrainSpec, sh: Shapes, roles: Roles, *, splash: bool, moe: bool
) -> dict[str, tuple[tuple[int, ...], int]]:
    """`_found` for any recipe of the same shapes (the dict is shared: read, never written)."""
    return _found(model, _shape_only(train), sh, roles, splash=splash, moe=moe)


@lru_cache(maxsize=4096)
def _found(
    model: ModelSpec, train: TrainSpec, sh: Shapes, roles: Roles, *, splash: bool, moe: bool
) -> dict[str, tuple[tuple[int, ...], int]]:
    """One layer's forward intermediates on one device: name -> (shape, bytes per element);
    `splash`: attention is TPU's splash kernel; `moe`: a MoE layer (its block's intermediates
    in place of the dense MLP's, its output `down` as a dense layer's); latent attention's
    differ from GQA's as cost/mla.py says."""
    cd = dtype_bytes(train.compute_dtype)
    r, s, hd = sh.micro_rows, sh.seq, model.head_dim
    # The residual stream (the layer's input, its norms and its two outputs) has its hidden
    # dim cut over the tensor axis; each norm's output is gathered whole for its matmuls.
    d = model.d_model // roles.size("model")
    found = {
        "input": ((r, s, d), cd),
        "attention norm": ((r, s, d), cd),
        "q": ((r, s, sh.heads, hd), cd),
        "k": ((r, s, sh.kv_heads, hd), cd),
        "v": ((r, s, sh.kv_heads, hd), cd),
        "rotated q": ((r, s, sh.heads, hd), cd),
        "rotated k": ((r, s, sh.kv_heads, hd), cd),
        "attention": ((r, s, sh.heads, hd), cd),
        "attention logsumexp": ((r, sh.heads, s), 4),
        "attention projection": ((r, s, d), cd),
        "mlp norm": ((r, s, d), cd),
        "up": ((r, s, sh.mlp), cd),
        "down": ((r, s, d), cd),
    }
    # SwiGLU: the gate projection and the gated product (silu(gate) * up); a two-matrix MLP:
    # its activation's output (relu or gelu of up), the down projection's input.
    if model.mlp == "swiglu":
        found |= {"gate": ((r, s, sh.mlp), cd), "gated": ((r, s, sh.mlp), cd)}
    else:
        found["activated"] = ((r, s, sh.mlp), cd)
    # The step normalises in float32: the backward pass of each norm holds its input widened.
    found |= {"attention norm input": ((r, s, d), 4), "mlp norm input": ((r, s, d), 4)}
    if roles.size("model") > 1:  # the norms' outputs gathered whole for the matmuls
        whole = (r, s, model.d_model)
        found |= {"gathered attention norm": (whole, cd), "gathered mlp norm": (whole, cd)}
    if model.parallel_block:  # the MLP reads the attention's norm (gathered once for both)
        found = {n: v for n, v in found.items() if "mlp norm" not in n}
    if roles.size("seq") > 1:  # keys and values gathered along the sequence
        full = (r, model.seq_len, sh.kv_heads, hd)
        found |= {"gathered k": (full, cd), "gathered v": (full, cd)}
    if train.attention == "plain":  # float32 scores and compute-dtype probabilities
        scores = (r, sh.heads, s, model.seq_len)
        found |= {"scores": (scores, 4), "probabilities": (scores, cd)}
    if splash:  # jax's kernel: its out_shapes in splash_attention_kernel.py, one per row (vmap)
        bq, bkv = splash_blocks(model.seq_len, roles)
        found["attention logsumexp"] = ((r, sh.heads, s, _LANES), 4)  # written lane-broadcast
        widths = (_LANES, _LANES, hd, hd, hd, hd)
        blocks = (bq, bq, bq, bq, bkv, bkv)
        found |= {n: ((r, b, w), 4) for n, b, w in zip(_SCRATCH, blocks, widths, strict=True)}
    if model.attention == "mla":
        found = mla.intermediates(model, found, cd)
    if moe:
        found = {n: v for n, v in found.items() if n not in ("gate", "up", "gated", "activated")}
        found |= moe_intermediates(model, train, roles, r, s)
    return found


_LANES = 128  # the splash kernel's NUM_LANES
# Its float32 accumulators: the forward's running max, sum and output, the backward's dq, dk, dv.
_SCRATCH = ("kernel max", "kernel sum", "kernel output", "kernel dq", "kernel dk", "kernel dv")


# A layer's backward pass holds the gradients of its intermediates, and under full remat also
# the intermediates it recomputes (measured factors of the named policies, bench_cost; "offload"
# recomputes what "full" does); on TPU full remat is counted per sublayer (`sublayer`).
_WORKING = {"full": 2, "dots": 1, "none": 1, "offload": 2}


@lru_cache(maxsize=8192)
def layer_bytes(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
    *,
    saved: bool,
    where: str = "device",
    moe: bool = False,
) -> int:
    """Bytes of one layer's intermediates as stored: with `saved` those the recipe keeps for
    the backward pass `where` ("device" or "offload": in host memory), stacked over the layers
    in the layout their producer gave them (head_dim minor for the attention kernel's operands);
    else all of them, as temporaries of the layer being differentiated, which the compiler lays
    out freely. `kernel` is the attention kernel the step runs (`profile.attention_kernel`);
    `moe`: a MoE layer's."""
    shaped = _shape_only(train)
    found = _found(model, shaped, sh, roles, splash=kernel == "splash", moe=moe)
    sizes = _sizes(model, shaped, sh, roles, tile, kernel, saved=saved, moe=moe)
    if not saved:
        return sum(sizes.values())
    return sum(
        sizes[name] if found.get(name) is value else _stored(name, value, tile, saved)
        for name, value in kept(train, found, where, kernel, model).items()
    )


def _stored(
    name: str, value: tuple[tuple[int, ...], int], tile: tuple[int, int] | None, saved: bool
) -> int:
    """`stored` for a named intermediate, its minor dim where the kernel fixes it."""
    return stored(*value, tile, minor=-1 if _fixed(name, saved) else None)


@lru_cache(maxsize=4096)
def _sizes(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
    *,
    saved: bool,
    moe: bool,
) -> dict[str, int]:
    """Each of `_found`'s intermediates as stored (layer_bytes's), by name."""
    found = _found(model, train, sh, roles, splash=kernel == "splash", moe=moe)
    return {name: _stored(name, value, tile, saved) for name, value in found.items()}


@lru_cache(maxsize=8192)
def working_bytes(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
    *,
    per_sublayer: bool = False,
    moe: bool = False,
    regather: bool = False,
    sublayer_weights: bool = True,
) -> int:
    """What one layer's backward pass holds of intermediates: their gradients, and what it
    recomputes. The named policies keep their measured factor; a custom placement holds every
    gradient plus the named tensors it recomputes (as "dots" when it recomputes none);
    `per_sublayer`: one sublayer at a time (`sublayer`), weights too with `sublayer_weights`;
    `moe`: a MoE layer; `regather`: q, k and v weights gathered again (`layout.regathered`)."""
    found = _intermediates(model, train, sh, roles, splash=kernel == "splash", moe=moe)
    if per_sublayer and not moe:
        sizes = {n: _stored(n, v, tile, False) for n, v in found.items()}
        twice = regathered(model, train, roles) if regather and sublayer_weights else ()
        m, cd = roles.size("model"), train.compute_dtype
        return recomputed_working(model, sizes, m, cd, twice, weights=sublayer_weights)
    everything = layer_bytes(
        model, _shape_only(train), sh, roles, tile, kernel, saved=False, moe=moe
    )
    if isinstance(train.remat, str) and train.remat in _WORKING:
        if not moe:
            return _WORKING[train.remat] * everything
        # A MoE layer: its block's buffers are a chain (copies, dispatch, experts, combine),
        # each live only around its own op. Its backward pass peaks at the experts, beside the
        # rest of the layer as recomputed, at the larger of two points, both holding the input
        # rows and the output's gradient (d_model wide): the SwiGLU's backward (gate and up
        # recomputed, their gradients: expert wide) or the input's gradient (the gate's and
        # up's gradients and the gated product; the input's gradient through gate, through up
        # and their sum, d_model wide), the larger where an expert is narrower than d_model
        # (libtpu's peak for DeepSeek's shrunk step over an expert axis: benchmarks/RESULTS.md).
        block = sum(stored(*v, tile) for n, v in found.items() if n in MOE_NAMES)
        rest = everything - block
        wide, narrow = stored(*found["expert out"], tile), stored(*found["expert gate"], tile)
        peak = max(2 * wide + 4 * narrow, 5 * wide + 3 * narrow)
        return max(_WORKING[train.remat] * rest, rest + peak)
    again = (n for t in recomputed(train, parallel=model.parallel_block) for n in PARTS[t])
    return everything + sum(stored(*found[n], tile) for n in again if n in found)


# The attention kernel's operands and result: head_dim is their minor dim.
_KERNEL = ("rotated q", "rotated k", "v", "gathered k", "gathered v", "attention", "kernel result")


def _fixed(name: str, saved: bool) -> bool:
    """Whether the kernel fixes the array's minor dim: its own buffers always, its operands
    and result as saved (where they keep the layout their producer gave them)."""
    return name in (*_SCRATCH, "attention logsumexp") or (saved and name in _KERNEL)


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
    dtypes = (train.param_dtype, train.opt_state_dtype, train.compute_dtype)
    held = device.traits.holds_reduced_gradients
    terms = dict(_fixed_terms(model, *dtypes, roles, tile, held, replicas_across_granules))
    sh = Shapes.of(model, train, roles)
    cd = dtype_bytes(train.compute_dtype)
    per_sublayer = counted_per_sublayer(train, traits := device.traits, roles.size("model"))
    logits = 2 * stored((sh.micro_rows, sh.seq, sh.vocab), cd, tile)
    if model.num_experts:
        activations, layer = _moe_layers(model, train, sh, roles, tile, kernel)
    else:
        weights = layer_weights(model, roles.size("model")) * cd
        saved = layer_bytes(model, train, sh, roles, tile, kernel, saved=True)
        activations = model.num_layers * saved
        regather = traits.regathers_attention_weights
        work = partial(working_bytes, model, train, sh, roles, tile, kernel, regather=regather)
        whole = not (per_sublayer and traits.sublayer_weights)
        layer = 3 * weights * whole + work(per_sublayer=per_sublayer, sublayer_weights=not whole)
    if traits.fuses_unlooped_gradients and model.num_layers == 1 == train.microbatches:
        terms["gradients"] = 0  # no layer loop: each gradient fused into its update
    return terms | {
        "batch": _batch_bytes(sh, tile),
        "activations": activations,
        "logits": -(-logits // train.logits_chunks),
        # Gradient accumulation: the running sum of every gradient shard, in float32.
        "accumulator": shard_bytes(model, roles, 4, tile) * (train.microbatches > 1),
        "layer": layer,
    }


def _moe_layers(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
) -> tuple[int, int]:
    """A model with MoE layers: (what its dense and MoE layers save, the larger of the two
    kinds' layer-loop terms: one layer's weights gathered and its backward pass's working set).
    A dense layer's weights count three times (see memory_terms); a MoE layer's attention,
    router and shared experts twice: the compiler prefetches no next layer's past the block's
    shard_map, so its backward pass holds them and their gradient before it is reduced. Its
    routed experts, as cost/moe.py gathers them, count once: each matrix's gradient leaves as
    the backward produces it (the compiled v5p-16 steps of benchmarks/bench_cost.py's MoE
    cases, and DeepSeek-V3 at full width on v5p-1024, where the 22.5 GB of experts gathered
    counted twice overstate libtpu's assignment by half: benchmarks/RESULTS.md)."""
    cd = dtype_bytes(train.compute_dtype)
    dense, moe = model.num_layers - model.num_moe_layers, model.num_moe_layers
    saved = partial(layer_bytes, model, train, sh, roles, tile, kernel, saved=True)
    work = partial(working_bytes, model, train, sh, roles, tile, kernel)
    shared, experts = moe_layer_weights(model, roles)
    layer = (2 * shared + experts) * cd + work(moe=True)
    if dense:
        weights = dense_layer_weights(model, roles.size("model")) * cd
        layer = max(layer, 3 * weights + work())
    return dense * saved() + moe * saved(moe=True), layer


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


@lru_cache(maxsize=4096)
def _fixed_terms(
    model: ModelSpec,
    param_dtype: str,
    opt_dtype: str,
    compute_dtype: str,
    roles: Roles,
    tile: tuple[int, int] | None,
    holds_reduced: bool,
    held_tables: bool,
) -> tuple[tuple[str, int], ...]:
    """The terms the recipe does not change: parameters, optimizer state, gradients, tables."""
    pd, od, cd = (dtype_bytes(x) for x in (param_dtype, opt_dtype, compute_dtype))
    table = stored((model.vocab_size // roles.size("model"), model.d_model), cd, tile)
    return (
        ("params", shard_bytes(model, roles, pd, tile)),
        ("optimizer", 2 * shard_bytes(model, roles, od, tile)),
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
    dtypes = (train.param_dtype, train.opt_state_dtype, train.compute_dtype)
    held = device.traits.holds_reduced_gradients
    terms = dict(_fixed_terms(model, *dtypes, roles, device.tile, held, replicas_across_granules))
    terms["batch"] = _batch_bytes(Shapes.of(model, train, roles), device.tile)
    return sum(terms[k] for k in (*ALWAYS, *PHASES["tail"]) if k in terms)


PHASES = {
    "backward head": ("activations", "gradients", "accumulator", "logits", "embeddings"),
    "layer loop": ("activations", "gradients", "accumulator", "reduced gradients", "layer"),
    "tail": ("gradients", "accumulator", "reduced gradients", "embeddings", "held tables"),
}
ALWAYS = ("params", "optimizer", "batch")


def phases(terms: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """Each phase's total (the arguments included), and the terms live in the largest."""
    totals = {name: sum(terms[k] for k in (*ALWAYS, *parts)) for name, parts in PHASES.items()}
    worst = max(totals, key=lambda name: totals[name])
    return totals, {*ALWAYS, *PHASES[worst]}


def _dp(roles: Roles) -> int:
    """1 where the step has data-parallel axes (it reduces gradients in the compute dtype)."""
    return int(bool(roles.data_parallel_axes()))
