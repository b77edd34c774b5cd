"""How the reference step lays a model over a mesh: parameter shapes with logical axes, and the
rules that map logical axes to the plan's mesh axes. Pure Python: the cost model reads it too.

Logical axes: `embed` (the d_model dim of weights) -> the FSDP axis, the sequence axis (context
parallelism shards the model as FSDP does) and the expert axis (which acts as FSDP outside the
experts, as in MaxText): `Roles.weight_axes`; `heads`, `kv_heads`, `mlp` and `vocab` -> the
tensor-parallel axis; `lora` (latent attention's ranks) as `embed`; `exp` (the expert dim of MoE
weights) -> the expert axis; `embed_no_exp` (the d_model dim of expert weights) -> the FSDP and
sequence axes, as MaxText's rules shard them (without an expert axis the experts sit on fsdp by
their d_model, which divides where the expert count need not: Mixtral's 8 experts over fsdp 64,
DeepSeek-V3's 256 over fsdp 512). Activations: `batch` -> the batch axes, `seq` -> the sequence
axis, `hidden` (the d_model dim of the residual stream between the layer's blocks) -> the
tensor-parallel axis, as MaxText's `activation_embed` shards it: what a layer saves of it is cut
by the tensor degree too. Axes are recognised by name (ROLE_NAMES); batch axes are the plan's.
The `pipeline` axis holds pipeline stages (stages.py): the logical `stage` dim of the pipelined
weights; it is no batch axis of the plan, but outside the pipelined layers the step runs it as
one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ..errors import MeshConfigError
from .modelled import MODELLED as MODELLED
from .modelled import check_modelled as check_modelled
from .spec import ModelSpec, TrainSpec
from .stages import Stages, pipeline_stages
from .zero import check_optimizer_over_data

# The mesh-axis names that play each role; an axis named otherwise must be a batch axis or 1.
ROLE_NAMES = {
    "fsdp": ("fsdp", "shard"),
    "model": ("model", "tp", "tensor"),
    "seq": ("seq", "sequence", "sequence_parallel", "sp", "context"),
    "expert": ("expert",),
}
# The pipeline axis's names: a role of the step and of the cost model (cost/pipeline/stages.py); the
# exports, which read ROLE_NAMES, do not take pipeline stages yet.
PIPELINE_NAMES = ("pipeline",)

Logical = tuple[str | None, ...]


@dataclass(frozen=True)
class Roles:
    """Which mesh axes shard what: batch axes (mesh order), and the FSDP, tensor, sequence,
    expert and pipeline axes (None where the mesh has none)."""

    sizes: tuple[tuple[str, int], ...]  # every mesh axis and its size, in mesh order
    batch: tuple[str, ...]
    fsdp: str | None
    model: str | None
    seq: str | None
    expert: str | None = None
    pipeline: str | None = None

    def size(self, role: str) -> int:
        """The degree of a role: the product of the batch axes for "batch", of fsdp and seq
        for "weights" (the axes that shard the weights outside the experts)."""
        if role in self._degrees:
            return self._degrees[role]
        axis = getattr(self, role)
        return 1 if axis is None else dict(self.sizes)[axis]

    @cached_property
    def _degrees(self) -> dict[str, int]:
        """Every role's degree, found once (the cost model asks for them in its inner loops)."""
        sizes = dict(self.sizes)
        out = {"batch": math.prod(sizes[a] for a in self.batch)}
        for role in ("fsdp", "model", "seq", "expert", "pipeline"):
            axis = getattr(self, role)
            out[role] = 1 if axis is None else sizes[axis]
        out["weights"] = out["fsdp"] * out["seq"]  # what shards the weights outside the experts
        return out

    def data_parallel_axes(self) -> tuple[str, ...]:
        """The batch axes of size > 1 that replicate the parameters (all but FSDP's and the
        expert axis)."""
        sizes = dict(self.sizes)
        return tuple(a for a in self.batch if a not in (self.fsdp, self.expert) and sizes[a] > 1)

    def mesh_axes(self, logical: Logical) -> tuple[str | tuple[str, ...] | None, ...]:
        """A PartitionSpec's entries for an array with these logical axes."""
        embed = self.weight_axes
        no_exp = tuple(a for a in embed if a != self.expert)
        table: dict[str, str | tuple[str, ...] | None] = {
            "embed": _entry(embed),
            "lora": _entry(embed),
            "exp": self.expert,
            "embed_no_exp": _entry(no_exp),
            "heads": self.model,
            "kv_heads": self.model,
            "mlp": self.model,
            "vocab": self.model,
            "hidden": self.model,
            "seq": self.seq,
            "batch": self.batch if len(self.batch) > 1 else self.batch[0],
            "stage": self.pipeline,
        }
        return tuple(None if name is None else table[name] for name in logical)

    @cached_property
    def weight_axes(self) -> tuple[str, ...]:
        """The mesh axes that cut the weights' d_model (`embed`), in order: FSDP's, the
        sequence axis where it splits the sequence (context parallelism shards the model as
        FSDP does: MaxText's `context` axis, torchtitan's dp_shard x cp), and the expert axis
        (FSDP outside the experts)."""
        seq = self.seq if self.seq is not None and self.size("seq") > 1 else None
        return tuple(a for a in (self.fsdp, seq, self.expert) if a is not None)

    def shards(self, logical: Logical) -> int:
        """Into how many pieces an array with these logical axes is cut."""
        total = 1
        for entry in self.mesh_axes(logical):
            for axis in (entry,) if isinstance(entry, str) else entry or ():
                total *= dict(self.sizes)[axis]
        return total


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    """A PartitionSpec entry for `axes`: one name alone, several as a tuple, none as None."""
    return axes[0] if len(axes) == 1 else (axes or None)


def roles(axis_sizes: Sequence[tuple[str, int]], batch_axes: Sequence[str]) -> Roles:
    """The role of every mesh axis; an axis of size > 1 with no role is an error."""
    sizes = tuple((str(a), int(n)) for a, n in axis_sizes)
    found: dict[str, str | None] = {}
    for role, names in {**ROLE_NAMES, "pipeline": PIPELINE_NAMES}.items():
        hits = [a for a, _ in sizes if a in names]
        if len(hits) > 1:
            raise MeshConfigError(
                f"mesh axes {hits} both play the {role} role; accepted: one axis per role"
            )
        found[role] = hits[0] if hits else None
    for axis, size in sizes:
        if size > 1 and axis not in batch_axes and axis not in found.values():
            accepted = ", ".join((*(n for v in ROLE_NAMES.values() for n in v), *PIPELINE_NAMES))
            raise MeshConfigError(
                f"mesh axis {axis!r} (size {size}) has no role in the reference step; "
                f"accepted: batch axes, or axes named {accepted}"
            )
    expert = found["expert"]
    if expert is not None and dict(sizes)[expert] > 1 and expert not in batch_axes:
        raise MeshConfigError(
            f"mesh axis {expert!r} (size {dict(sizes)[expert]}) is no batch axis, but the expert "
            "axis splits the batch as FSDP does outside the experts; accepted: batch axes that "
            "include it"
        )
    batch = tuple(a for a, _ in sizes if a in batch_axes)
    return Roles(
        sizes,
        batch,
        found["fsdp"],
        found["model"],
        found["seq"],
        found["expert"],
        found["pipeline"],
    )


SPLASH_BLOCK = 512  # splash-attention block size (MaxText's default), or the sequence if shorter


def splash_blocks(seq_len: int, r: Roles) -> tuple[int, int]:
    """The splash kernel's query and key blocks (a device's query slice when shorter)."""
    return min(SPLASH_BLOCK, seq_len // r.size("seq")), min(SPLASH_BLOCK, seq_len)


def param_shapes(model: ModelSpec) -> dict[str, tuple[tuple[int, ...], Logical]]:
    """Every parameter: its shape and logical axes. Layer weights are stacked on a leading dim
    (a scan runs over it): `layers/` the dense layers (all `num_layers` of a dense model),
    `moe_layers/` the MoE layers of a model with experts (`moe_param_shapes`). A two-matrix MLP
    has no gate; tied embeddings no unembedding; a parallel block one norm (`attn_norm`)."""
    check_modelled(model, by="the reference step", experts=True, latent=True)
    m = model
    L, D, F = m.num_layers - m.num_moe_layers, m.d_model, m.d_ff
    attention = {f"layers/{k}": ((L, *s), (None, *ax)) for k, (s, ax) in _attention(m).items()}
    shapes: dict[str, tuple[tuple[int, ...], Logical]] = {
        "embed": ((m.vocab_size, D), ("vocab", "embed")),
        "final_norm": ((D,), (None,)),
        "layers/attn_norm": ((L, D), (None, None)),
        **attention,
        **({} if m.parallel_block else {"layers/mlp_norm": ((L, D), (None, None))}),
        **({"layers/w_gate": ((L, D, F), (None, "embed", "mlp"))} if m.mlp == "swiglu" else {}),
        "layers/w_up": ((L, D, F), (None, "embed", "mlp")),
        "layers/w_down": ((L, F, D), (None, "mlp", "embed")),
    }
    if not m.tied_embeddings:
        shapes["unembed"] = ((D, m.vocab_size), ("embed", "vocab"))
    if m.num_experts:
        shapes.update(moe_param_shapes(m, shapes))
    return {k: v for k, v in shapes.items() if L or not k.startswith("layers/")}


def _attention(m: ModelSpec) -> dict[str, tuple[tuple[int, ...], Logical]]:
    """One layer's attention weights. GQA: q, k, v and output projections. MLA (as MaxText
    shards it): the query's down-projection to `q_lora_rank` and its norm, its up-projection to
    every head's nope and rope parts (or, with rank 0, one full-rank projection); the keys' and
    values' down-projection to `kv_lora_rank` plus the shared rope key, its norm, the
    up-projection to every head's nope key and value; the output projection. The ranks are
    sharded as d_model is (`lora`), replicated over the tensor axis; the heads over it."""
    D, H = m.d_model, m.num_heads
    if m.attention == "gqa":
        hd, kv = m.head_dim, m.num_kv_heads
        return {
            "wq": ((D, H, hd), ("embed", "heads", None)),
            "wk": ((D, kv, hd), ("embed", "kv_heads", None)),
            "wv": ((D, kv, hd), ("embed", "kv_heads", None)),
            "wo": ((H, hd, D), ("heads", None, "embed")),
        }
    q_rank, kv_rank = m.q_lora_rank, m.kv_lora_rank
    query: dict[str, tuple[tuple[int, ...], Logical]] = (
        {
            "wq_a": ((D, q_rank), ("embed", None)),
            "q_norm": ((q_rank,), (None,)),
            "wq_b": ((q_rank, H, m.head_dim), ("lora", "heads", None)),
        }
        if q_rank
        else {"wq": ((D, H, m.head_dim), ("embed", "heads", None))}
    )
    return query | {
        "wkv_a": ((D, kv_rank + m.qk_rope_head_dim), ("embed", None)),
        "kv_norm": ((kv_rank,), (None,)),
        "wkv_b": ((kv_rank, H, m.qk_nope_head_dim + m.v_head_dim), ("lora", "heads", None)),
        "wo": ((H, m.v_head_dim, D), ("heads", None, "embed")),
    }


# A dense layer's MLP weights: the rest of it a MoE layer shares (moe_param_shapes).
_MLP_WEIGHTS = ("w_gate", "w_up", "w_down")


def moe_param_shapes(
    m: ModelSpec, dense: dict[str, tuple[tuple[int, ...], Logical]]
) -> dict[str, tuple[tuple[int, ...], Logical]]:
    """The `moe_layers/` stack (`num_moe_layers` deep): a dense layer's norms and attention
    (from `dense`), the router, the routed experts (SwiGLU of width `moe_d_ff`, the expert dim
    first) and the shared experts as one SwiGLU MLP of their summed width."""
    M, D, E, F = m.num_moe_layers, m.d_model, m.num_experts, m.moe_d_ff
    layer: dict[str, tuple[tuple[int, ...], Logical]] = {
        k.split("/", 1)[1]: (shape[1:], axes[1:])
        for k, (shape, axes) in dense.items()
        if k.startswith("layers/") and k.split("/", 1)[1] not in _MLP_WEIGHTS
    }
    layer.update(
        {
            "router": ((D, E), ("embed", None)),
            "we_gate": ((E, D, F), ("exp", "embed_no_exp", "mlp")),
            "we_up": ((E, D, F), ("exp", "embed_no_exp", "mlp")),
            "we_down": ((E, F, D), ("exp", "mlp", "embed_no_exp")),
        }
    )
    if m.num_shared_experts:
        S = m.num_shared_experts * F
        layer.update(
            {
                "ws_gate": ((D, S), ("embed", "mlp")),
                "ws_up": ((D, S), ("embed", "mlp")),
                "ws_down": ((S, D), ("mlp", "embed")),
            }
        )
    return {f"moe_layers/{k}": ((M, *shape), (None, *ax)) for k, (shape, ax) in layer.items()}


def check_fit(model: ModelSpec, train: TrainSpec, r: Roles) -> Stages | None:
    """The model is one the step builds and the cost model prices (`check_modelled`: MoE
    layers with SwiGLU experts included), every sharded dim divides by its axis, the global
    batch by the batch degree, and the recipe's slices by what they slice: micro-batches each
    device's rows, logits chunks each device's slice of the sequence; with a pipeline axis
    larger than 1, the pipeline fields. Returns the step's stages (`stages_of`), or None."""
    check_modelled(model, by="the reference step and the cost model", experts=True, latent=True)
    st = stages_of(model, train, r)
    check_optimizer_over_data(train, r.sizes, r.data_parallel_axes())
    batch = r.size("batch")
    if train.global_batch % batch:
        raise MeshConfigError(
            f"global_batch={train.global_batch} does not divide by the data-parallel degree "
            f"{batch} (batch axes {', '.join(r.batch)}); accepted: a positive multiple of {batch}"
        )
    rows = train.global_batch // batch
    if rows % train.microbatches:
        raise MeshConfigError(
            f"microbatches={train.microbatches} does not divide the per-replica batch {rows} "
            f"(global_batch {train.global_batch} over the data-parallel degree {batch}); "
            f"accepted: a divisor of {rows}"
        )
    check_sequence(model, train, r)
    tokens = model.seq_len // r.size("seq")
    if tokens % train.logits_chunks:
        raise MeshConfigError(
            f"logits_chunks={train.logits_chunks} does not divide a device's slice of the "
            f"sequence, {tokens} tokens (seq_len {model.seq_len} over the sequence degree "
            f"{r.size('seq')}); accepted: a divisor of {tokens}"
        )
    dims = {
        "model": (
            ("num_heads", model.num_heads),
            ("num_kv_heads", model.num_kv_heads),
            ("d_ff", model.d_ff),
            ("vocab_size", model.vocab_size),
            ("d_model", model.d_model),  # the residual stream's hidden dim
        ),
        "fsdp": (("d_model", model.d_model),),
    }
    if model.num_experts:
        dims["model"] += (("moe_d_ff", model.moe_d_ff),)
    for role, checks in dims.items():
        size = r.size(role)
        for field, value in checks:
            if value % size:
                raise MeshConfigError(
                    f"model {model.name!r}: {field}={value} does not divide over the {role} axis "
                    f"{getattr(r, role)!r} of size {size}; accepted: a {role} axis whose size "
                    f"divides {field}"
                )
    sharded_as_d_model = ("d_model",) + (
        ("q_lora_rank", "kv_lora_rank") if model.attention == "mla" else ()
    )
    for field in sharded_as_d_model:
        value = getattr(model, field)
        if value % r.shards(("embed",)):
            sizes = dict(r.sizes)
            axes = " x ".join(f"{a!r} {sizes[a]}" for a in r.weight_axes if sizes[a] > 1)
            raise MeshConfigError(
                f"model {model.name!r}: {field}={value} does not divide over the fsdp, seq and "
                f"expert axes together ({r.shards(('embed',))} shards: {axes}), which shard "
                f"the weights' d_model; accepted: axes whose sizes' product divides {field}"
            )
    if model.num_experts and model.num_experts % r.size("expert"):
        raise MeshConfigError(
            f"model {model.name!r}: num_experts={model.num_experts} does not divide over the "
            f"expert axis {r.expert!r} of size {r.size('expert')}; accepted: an expert axis "
            "whose size divides num_experts (or none: the experts then sit on fsdp by d_model)"
        )
    return st


def check_sequence(model: ModelSpec, train: TrainSpec, r: Roles) -> None:
    """The sequence divides into the chunks the `seq` axis holds: 2 x seq under
    `context_load_balance` (device i holds chunks i and 2 seq - 1 - i, workload/context.py),
    seq otherwise."""
    seq = r.size("seq")
    balanced = train.context_load_balance and seq > 1
    chunks = 2 * seq if balanced else seq
    if model.seq_len % chunks:
        how = (
            f"context_load_balance=True cuts it into 2 x {seq} chunks"
            if balanced
            else f"{chunks} chunks, one a device"
        )
        raise MeshConfigError(
            f"model {model.name!r}: seq_len={model.seq_len} does not divide over the seq axis "
            f"{r.seq!r} of size {seq} ({how}); accepted: a seq_len that is a multiple of "
            f"{chunks}"
            + (", or context_load_balance=False" if balanced and model.seq_len % seq == 0 else "")
        )


def regathered(model: ModelSpec, train: TrainSpec, roles: Roles) -> tuple[str, ...]:
    """The projections (query, key, value) whose backward pass, where the compiler wants it
    (`PlatformTraits.regathers_attention_weights`), gathers the weight again rather than
    holding the gathered copy the recompute made: those the pass recomputes, where the weights
    are gathered (over fsdp, or a sequence or expert axis acting as fsdp: `Roles.weight_axes`),
    in grouped-query attention of a sequential layer. MaxText's step does so; libtpu otherwise
    keeps the three gathered weights through the MLP's recompute and backward (0.9 GB on GPT-3
    175B at fsdp 256). Not in a parallel block, whose MLP is differentiated beside the
    attention: there (MaxText-2023 128B, fsdp 16 x tensor 16) libtpu then gathers the MLP's
    weights 13 times a layer, not 4, and assigns more
    (docs/notes/2026-11-26-maxtext-2023-parallel-block.md)."""
    gathered = roles.shards(("embed",)) > 1
    if model.attention != "gqa" or model.parallel_block or not gathered:
        return ()
    return tuple(t for t in ("query", "key", "value") if train.placements[t] == "recompute")


def regathered_weights(model: ModelSpec, names: tuple[str, ...], m: int) -> int:
    """Elements of the named projections' weights (`regathered`'s) on one device once gathered,
    heads cut over a tensor axis of size `m`."""
    heads = {"query": model.num_heads, "key": model.num_kv_heads, "value": model.num_kv_heads}
    return sum(model.d_model * (heads[t] // m) * model.head_dim for t in names)


def stages_of(model: ModelSpec, train: TrainSpec, r: Roles) -> Stages | None:
    """The step's pipeline stages on these roles (`stages.pipeline_stages`, which checks them);
    None without a pipeline axis larger than 1."""
    if r.pipeline is None or r.size("pipeline") == 1:
        return None
    n, batch = r.size("pipeline"), r.size("batch")
    return pipeline_stages(model, train, axis=r.pipeline, stages=n, batch=batch, axes=r.batch)
