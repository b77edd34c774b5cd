"""Memory per device of the reference step, term by term, and its peak.

The step holds its arguments for the whole step (parameters and Adam's moments, donated so
the updated ones reuse them; the batch) and, on top, what the phase it is in needs. Three phases
can set the peak: the head of the backward pass (saved layer inputs, every gradient shard, the
logits and their gradient, a gathered embedding table and its gradient), the layer loop (saved
inputs, every gradient shard and, across data-parallel axes, their compute-dtype copy; one
layer's weights gathered, twice for prefetch and once as their gradient before it is reduced;
its intermediates, recomputed under full remat, and their gradients; on TPU the splash kernel's
float32 buffers among them) and the tail (gradient shards, a table and its gradient). The
largest is the peak. On TPU every array is stored in whole memory tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..workload.layout import Roles, implementation, param_shapes, splash_blocks
from ..workload.spec import ModelSpec, TrainSpec, dtype_bytes


@dataclass(frozen=True)
class Shapes:
    """The per-device sizes the memory and traffic models share."""

    tokens: int  # tokens one device computes (its batch rows times its sequence slice)
    rows: int  # sequences one device holds
    seq: int  # sequence slice length
    heads: int  # query heads on one device
    kv_heads: int
    mlp: int  # d_ff on one device
    vocab: int  # vocabulary on one device

    @classmethod
    def of(cls, model: ModelSpec, train: TrainSpec, roles: Roles) -> Shapes:
        rows = train.global_batch // roles.size("batch")
        seq = model.seq_len // roles.size("seq")
        m = roles.size("model")
        return cls(
            tokens=rows * seq,
            rows=rows,
            seq=seq,
            heads=model.num_heads // m,
            kv_heads=model.num_kv_heads // m,
            mlp=model.d_ff // m,
            vocab=model.vocab_size // m,
        )


def stored(
    shape: tuple[int, ...], nbytes: int, tile: tuple[int, int] | None, *, minor: int | None = None
) -> int:
    """Bytes an array takes in memory. On TPU the compiler puts a dim in the 128 lanes (the one
    that wastes least, or `minor` where the op fixes it, as a matmul fixes its contracted dim)
    and the largest other dim in the rows (8 for 4-byte types, 16 for 2-byte); a dim shorter
    than a row tile takes a smaller tile, as T(4,128) does."""
    elements = math.prod(shape)
    if tile is None or not shape:
        return elements * nbytes
    rows, lanes = tile[0] * max(1, 4 // nbytes), tile[1]
    sizes = []
    for k in range(len(shape)) if minor is None else (minor % len(shape),):
        rest = [d for j, d in enumerate(shape) if j != k]
        second = max(rest, default=1)
        padded_second = second if second < rows else -(-second // rows) * rows
        sizes.append(-(-shape[k] // lanes) * lanes * padded_second * (math.prod(rest) // second))
    return min(sizes) * nbytes


def shard_bytes(model: ModelSpec, roles: Roles, nbytes: int, tile: tuple[int, int] | None) -> int:
    """Bytes of one device's shard of every parameter, stored in `nbytes`-byte words."""
    total = 0
    for shape, logical in param_shapes(model).values():
        entries = roles.mesh_axes(logical)
        local = []
        for dim, entry in zip(shape, entries, strict=True):
            axes = (entry,) if isinstance(entry, str) else entry or ()
            local.append(dim // math.prod(dict(roles.sizes)[a] for a in axes))
        total += stored(tuple(local), nbytes, tile)
    return total


def layer_weights(model: ModelSpec, m: int) -> int:
    """One layer's weights on one device once gathered over FSDP (elements)."""
    return (model.layer_params - 2 * model.d_model) // m


def _intermediates(
    model: ModelSpec, train: TrainSpec, sh: Shapes, roles: Roles, *, splash: bool
) -> dict[str, tuple[tuple[int, ...], int]]:
    """One layer's forward intermediates on one device: name -> (shape, bytes per element);
    `splash`: attention is TPU's splash kernel."""
    cd = dtype_bytes(train.compute_dtype)
    r, s, d, hd = sh.rows, sh.seq, model.d_model, model.head_dim
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
        "gate": ((r, s, sh.mlp), cd),
        "up": ((r, s, sh.mlp), cd),
        "gated": ((r, s, sh.mlp), cd),
        "down": ((r, s, d), cd),
    }
    # The step normalises in float32: the backward pass of each norm holds its input widened.
    found |= {"attention norm input": ((r, s, d), 4), "mlp norm input": ((r, s, d), 4)}
    if roles.size("model") > 1:  # each tensor-parallel all-reduce has its own output buffer
        found |= {"reduced attention": ((r, s, d), cd), "reduced mlp": ((r, s, d), cd)}
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
    return found


_LANES = 128  # the splash kernel's NUM_LANES
# Its float32 accumulators: the forward's running max, sum and output, the backward's dq, dk, dv.
_SCRATCH = ("kernel max", "kernel sum", "kernel output", "kernel dq", "kernel dk", "kernel dv")


# A layer's backward pass holds the gradients of its intermediates, and under full remat also
# the intermediates it recomputes.
_WORKING = {"full": 2, "dots": 1, "none": 1}

# What each remat policy keeps of a layer for the backward pass.
_SAVED = {
    "full": ("input",),
    "dots": ("input", "q", "k", "v", "attention projection", "gate", "up", "down"),
}


def layer_bytes(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    *,
    saved: bool,
) -> int:
    """Bytes of one layer's intermediates as stored: with `saved` those the remat policy keeps
    for the backward pass, stacked over the layers in the layout their producer gave them
    (head_dim minor for the attention kernel's operands); else all of them, as temporaries of
    the layer being differentiated, which the compiler lays out freely."""
    platform = "tpu" if tile is not None else "gpu"  # only TPU arrays are stored in tiles
    splash = implementation(train.attention, platform) == "splash"
    found = _intermediates(model, train, sh, roles, splash=splash)
    everything = tuple(n for n in found if not (saved and n in _SCRATCH))  # never read again
    keep = _SAVED.get(train.remat_text, everything) if saved else everything
    return sum(
        stored(shape, nbytes, tile, minor=-1 if _fixed(name, saved) else None)
        for name, (shape, nbytes) in found.items()
        if name in keep
    )


# The attention kernel's operands and result: head_dim is their minor dim.
_KERNEL = ("rotated q", "rotated k", "v", "gathered k", "gathered v", "attention")


def _fixed(name: str, saved: bool) -> bool:
    """Whether the kernel fixes the array's minor dim: its own buffers always, its operands
    and result as saved (where they keep the layout their producer gave them)."""
    return name in (*_SCRATCH, "attention logsumexp") or (saved and name in _KERNEL)


def memory_terms(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    tile: tuple[int, int] | None,
    *,
    batch_across_granules: bool = False,
) -> dict[str, int]:
    """Every term in bytes per device; `phases` says which of them are live at once. Where the
    batch spans TPU slices, the embedding tables' gradients wait for the reduction across slices
    (the hosts' megascale transfers, at the end of the step): both tables and both gradients
    are held (`batch_across_granules`; GPUs reduce across hosts as they go)."""
    sh = Shapes.of(model, train, roles)
    pd, od, cd = (
        dtype_bytes(x) for x in (train.param_dtype, train.opt_state_dtype, train.compute_dtype)
    )
    m = roles.size("model")
    table = stored((sh.vocab, model.d_model), cd, tile)
    layer = layer_weights(model, m) * cd
    return {
        "params": shard_bytes(model, roles, pd, tile),
        "optimizer": 2 * shard_bytes(model, roles, od, tile),
        "gradients": shard_bytes(model, roles, pd, tile),
        # Across data-parallel axes the gradient shards are reduced in the compute dtype: a
        # second set of them, stacked over the layers like the float32 one.
        "reduced gradients": shard_bytes(model, roles, cd, tile) * bool(roles.data_parallel_axes()),
        "batch": 2 * stored((sh.rows, sh.seq), 4, tile),
        "activations": model.num_layers * layer_bytes(model, train, sh, roles, tile, saved=True),
        "logits": 2 * stored((sh.rows, sh.seq, sh.vocab), cd, tile),
        "embeddings": (4 if batch_across_granules else 2) * table,
        "layer": 3 * layer
        + _WORKING[train.remat_text] * layer_bytes(model, train, sh, roles, tile, saved=False),
    }


PHASES = {
    "backward head": ("activations", "gradients", "logits", "embeddings"),
    "layer loop": ("activations", "gradients", "reduced gradients", "layer"),
    "tail": ("gradients", "reduced gradients", "embeddings"),
}
ALWAYS = ("params", "optimizer", "batch")


def phases(terms: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """Each phase's total (the arguments included), and the terms live in the largest."""
    totals = {name: sum(terms[k] for k in (*ALWAYS, *parts)) for name, parts in PHASES.items()}
    worst = max(totals, key=lambda name: totals[name])
    return totals, {*ALWAYS, *PHASES[worst]}
