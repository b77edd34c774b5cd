"""What one layer of the reference step holds on a device: the tensors it saves for the
backward pass (as the recipe places them) and its backward pass's working set, recomputed
intermediates and their gradients included (cost/memory/terms.py adds them up into the step's
terms). On TPU every array is stored in whole memory tiles."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ...workload.layout import Roles, regathered, splash_blocks
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..parts import mla
from ..parts.cache import plain_cache
from ..parts.moe import MOE_NAMES, moe_intermediates
from ..parts.saved import PARTS, kept, recomputed, unrolled_residuals
from ..parts.shapes import Shapes, stored
from ..parts.sublayer import recomputed_working


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


@lru_cache(maxsize=65536)
def _found(
    model: ModelSpec, train: TrainSpec, sh: Shapes, roles: Roles, *, splash: bool, moe: bool
) -> dict[str, tuple[tuple[int, ...], int]]:
    """One layer's forward intermediates on one device: name -> (shape, bytes per element);
    `splash`: attention is TPU's splash kernel; `moe`: a MoE layer (its block's intermediates
    in place of the dense MLP's, its output `down` as a dense layer's); latent attention's
    differ from GQA's as cost/parts/mla.py says."""
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


@plain_cache(maxsize=65536)
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


@plain_cache(maxsize=65536)
def unrolled_bytes(
    model: ModelSpec,
    train: TrainSpec,
    sh: Shapes,
    roles: Roles,
    tile: tuple[int, int] | None,
    kernel: str,
    *,
    moe: bool = False,
) -> int:
    """Bytes one layer recomputed inside a pipeline iteration's checkpoint holds until its
    backward pass (`saved.unrolled_residuals`) beyond what the recipe saves of it anyway."""
    shaped = _shape_only(train)
    found = _found(model, shaped, sh, roles, splash=kernel == "splash", moe=moe)
    placed = kept(train, found, "device", kernel, model)
    return sum(
        _stored(name, value, tile, True)
        for name, value in unrolled_residuals(found, kernel, model.mlp).items()
        if name not in placed
    )


def _stored(
    name: str, value: tuple[tuple[int, ...], int], tile: tuple[int, int] | None, saved: bool
) -> int:
    """`stored` for a named intermediate, its minor dim where the kernel fixes it."""
    return stored(*value, tile, minor=-1 if _fixed(name, saved) else None)


@lru_cache(maxsize=65536)
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


@plain_cache(maxsize=65536)
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
        # (libtpu's peak for DeepSeek's shrunk step over an expert axis:
        # docs/notes/2026-11-26-moe-memory-rerefereed.md).
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
