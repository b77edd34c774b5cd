"""What the reference step trains: a model's shape (`ModelSpec`, in model.py) and how it trains
(`TrainSpec`). Pure Python: the cost model reads these without jax.
"""

from __future__ import annotations

import ast
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import Any, Literal, get_args

from ..errors import MeshConfigError
from .model import ModelSpec as ModelSpec
from .model import _count, _positive
from .model import list_models as list_models

# The choices of TrainSpec's fields, each written once: the Literal its field is typed with,
# and the tuple of its values that the checks and the command line read.
Dtype = Literal["float32", "bfloat16"]
DTYPES: tuple[str, ...] = get_args(Dtype)
# The named tensors of a layer a remat policy places, and where each may go.
TENSORS = (
    "layer_input",
    "query",
    "key",
    "value",
    "attention_out",
    "out_proj",
    "mlp_in",
    "mlp_out",
)
PLACEMENTS = ("recompute", "device", "offload")
# The named policies, each a shorthand for a placement of every tensor. The layer input is the
# scan's carry: it is saved (on the device or in host memory), never recomputed.
_DOTS = ("query", "key", "value", "out_proj", "mlp_in", "mlp_out")
POLICIES: dict[str, dict[str, str]] = {
    "full": {t: "device" if t == "layer_input" else "recompute" for t in TENSORS},
    "dots": {t: "device" if t == "layer_input" or t in _DOTS else "recompute" for t in TENSORS},
    # Every named tensor saved, the rest recomputed: MaxText's minimal_flash (its A3 runs).
    "dots_attention": dict.fromkeys(TENSORS, "device"),
    "none": {t: "device" for t in TENSORS},
    "offload": {t: "offload" if t == "layer_input" else "recompute" for t in TENSORS},
}
REMAT = tuple(POLICIES)
# The policies a mapping is stored as when it places every tensor as they do: the step compiles
# the same program for both. Not "none": that is no checkpoint at all, which also keeps every
# unnamed intermediate (norms, rotated q and k, the gated product); "dots_attention" (every
# named tensor on the device) recomputes those.
_SAME_STEP = ("full", "dots", "dots_attention", "offload")
Attention = Literal["flash", "plain"]
ATTENTION: tuple[str, ...] = get_args(Attention)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# How a step runs MoE layers (TrainSpec.moe, TrainSpec.routing).
MoePath = Literal["dropless", "capacity"]
MOE: tuple[str, ...] = get_args(MoePath)
Routing = Literal["learned", "balanced"]
ROUTING: tuple[str, ...] = get_args(Routing)
# Where a pipelined step checkpoints (TrainSpec.pipeline_remat).
PipelineRemat = Literal["layer", "iteration"]
PIPELINE_REMAT: tuple[str, ...] = get_args(PipelineRemat)
# The order a pipeline's stages run their micro-batches in (TrainSpec.pipeline_schedule).
PipelineSchedule = Literal["gpipe", "1f1b"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
# How attention runs over the `seq` axis (TrainSpec.context_strategy).
ContextStrategy = Literal["all_gather", "ring"]
CONTEXT_STRATEGIES: tuple[str, ...] = get_args(ContextStrategy)
# The precision of the step's matmuls (TrainSpec.quantization).
Quantization = Literal["none", "fp8", "int8"]
QUANTIZATION: tuple[str, ...] = get_args(Quantization)


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES[dtype]


def parse_remat(text: str) -> str | dict[str, str]:
    """A remat policy as the command line writes it: a name (`full`) or tensor=placement pairs
    (`layer_input=offload,query=offload`; tensors not named are recomputed, the layer input
    kept on the device)."""
    if "=" not in text:
        return text
    out: dict[str, str] = {}
    for part in text.split(","):
        name, sep, placement = part.partition("=")
        if not sep or name.strip() in out:
            raise MeshConfigError(
                f"remat={text!r}: {part!r} is no new tensor=placement pair; accepted: a policy "
                f"({', '.join(REMAT)}) or pairs like layer_input=offload,query=device"
            )
        out[name.strip()] = placement.strip()
    return out


def _placements(remat: Any) -> tuple[tuple[str, str], ...]:
    """Every tensor of TENSORS with its placement, for a policy name or a (partial) mapping."""
    if isinstance(remat, str):
        if remat not in POLICIES:
            raise MeshConfigError(
                f"remat={remat!r}; accepted: {', '.join(REMAT)}, or a mapping from tensors "
                f"({', '.join(TENSORS)}) to placements ({', '.join(PLACEMENTS)})"
            )
        return tuple(POLICIES[remat].items())
    if not isinstance(remat, Mapping):
        raise MeshConfigError(
            f"remat={remat!r}; accepted: a policy name ({', '.join(REMAT)}) or a mapping from "
            "tensor names to placements"
        )
    for name, placement in remat.items():
        if name not in TENSORS:
            raise MeshConfigError(
                f"remat: tensor {name!r} is not a named tensor of a layer; accepted: "
                f"{', '.join(TENSORS)}"
            )
        if placement not in PLACEMENTS:
            raise MeshConfigError(f"remat: {name}={placement!r}; accepted: {', '.join(PLACEMENTS)}")
    if remat.get("layer_input") == "recompute":
        raise MeshConfigError(
            "remat: layer_input='recompute'; the layer input is the scan's carry, saved for the "
            "backward pass; accepted: device, offload"
        )
    default = POLICIES["full"]
    return tuple((t, remat.get(t, default[t])) for t in TENSORS)


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """How a step trains: the global batch, dtypes, attention and the recipe (remat placement,
    micro-batches, logits chunks, the MoE path, the pipeline's schedule). Each field's text says
    what it is, its unit and the values it takes; the command line has a flag for each, the
    field's name with dashes for underscores.

    Raises:
        MeshConfigError: when built with an invalid field (a batch that is not a positive int,
            an unknown dtype, remat policy, tensor or placement, MoE option, ...), naming the
            field, the value and what is accepted.
    """

    global_batch: int
    """Sequences per step over the whole job (each of the model's `seq_len` tokens); a
    positive integer."""
    param_dtype: Dtype = "float32"
    """The dtype the parameters are kept in, float32 or bfloat16."""
    compute_dtype: Dtype = "bfloat16"
    """The dtype the step computes in (parameters cast to it, activations held in it),
    float32 or bfloat16."""
    opt_state_dtype: Dtype = "float32"
    """The dtype of Adam's two moments, float32 or bfloat16 (half the optimizer's memory)."""
    optimizer_over_data: bool = False
    """Whether Adam's moments and update are sharded over the `data` axis while the
    parameters stay replicated there (ZeRO-1: MaxText's shard_optimizer_over_data, Megatron's
    distributed optimizer): the gradients reduce-scattered over data, the updated parameters
    gathered back; True or False."""
    remat: str | tuple[tuple[str, str], ...] = "full"
    """Where the backward pass finds each named tensor of a layer (TENSORS), each one
    "recompute", "device" (saved in HBM) or "offload" (saved in host memory). A policy name is
    a shorthand: "full" saves only the layer input, "dots" also the matmul outputs,
    "dots_attention" also the attention's output (every named tensor), "none" everything (no
    checkpoint), "offload" the layer input in host memory. A mapping names some tensors (the
    rest recomputed, the layer input kept on the device) and is stored as the policy name it
    equals (except "none", which checkpoints nothing, unnamed intermediates included), or
    else as (tensor, placement) pairs for every tensor."""
    attention: Attention = "flash"
    """How attention runs, "flash" or "plain". "flash" is jax's splash kernel on TPU and
    `jax.nn.dot_product_attention` elsewhere (cuDNN on GPU); "plain" writes the score matrix
    out in XLA."""
    quantization: Quantization = "none"
    """The precision of the projections' and MLP matmuls (expert matmuls included), "none",
    "fp8" or "int8". "none" runs them in `compute_dtype`; "fp8" with float8 operands (e4m3
    forward, e5m2 gradients) and absmax scales per row and output channel, float32
    accumulation; "int8" with int8 operands (gradients too) and such scales, int32
    accumulation. Attention, the router and the head stay in `compute_dtype`, and so do the
    dropless experts on GPU (tokamax's kernels take no low-precision activations)."""
    context_strategy: ContextStrategy = "all_gather"
    """On a mesh with a `seq` axis (context parallelism), how attention reaches the keys and
    values of the other shards, "all_gather" or "ring". "all_gather" gathers them over `seq`
    each layer (their gradients reduce-scattered); "ring" passes key/value blocks round `seq`
    by collective-permute, each hop overlapped with the attention of the block in hand."""
    context_load_balance: bool = True
    """On a mesh with a `seq` axis, whether the sequence is cut into 2 x seq chunks, device i
    holding chunks i and 2 seq - 1 - i so that causal attention's work is even (MaxText's
    dual-chunk-swap, torchtitan's head-tail); False: contiguous chunks, the last shard doing
    the most work; True or False."""
    learning_rate: float = 1e-3
    """Adam's step size (bias-corrected); a positive float. The cost model does not read it."""
    microbatches: int = 1
    """Gradient accumulation, the step's batch run in that many sequential slices with the
    gradients summed; a positive integer that divides `global_batch`."""
    logits_chunks: int = 1
    """The loss computed over that many slices of the tokens, so the [tokens, vocab] logits
    never exist whole; a positive integer."""
    moe: MoePath = "dropless"
    """How a model with experts runs its MoE layers, "dropless" or "capacity". "dropless"
    gives every expert all the tokens routed to it; "capacity" gives each at most
    `capacity_factor` times its even share and drops the rest. Not read for a model without
    experts."""
    capacity_factor: float = 1.25
    """Under moe="capacity", an expert's capacity over its even share of the token copies; a
    positive finite number."""
    routing: Routing = "learned"
    """Which experts a token goes to, "learned" or "balanced". "learned" follows the router;
    "balanced" spreads tokens evenly over the experts, as published MoE benchmark runs force
    it."""
    pipeline_microbatches: int = 0
    """On a mesh with a pipeline axis, the micro-batches that flow through its stages; a
    non-negative integer, 0 for as many as stages (docs/design.md section 12)."""
    pipeline_repeats: int = 1
    """On a mesh with a pipeline axis, the chunks of layers each stage holds, not adjacent; a
    positive integer, 1 for GPipe, more for the circular schedule (MaxText's
    num_pipeline_repeats, Megatron's virtual stages)."""
    pipeline_layers: int = 0
    """On a mesh with a pipeline axis, how many of the last decoder layers are pipelined (the
    layers before them run with the pipeline axis acting as data); a non-negative integer, 0
    for every layer."""
    pipeline_remat: PipelineRemat = "layer"
    """On a mesh with a pipeline axis, where the stages checkpoint under `remat`, "layer" or
    "iteration". "layer" checkpoints each layer (a layer's backward pass holds one layer's
    recomputed intermediates), "iteration" a stage's chunk of layers an iteration, each
    layer's input saved (MaxText's pipeline: the backward pass of a chunk holds all its
    layers' intermediates at once). The five pipeline fields are read only on a mesh whose
    pipeline axis is larger than 1 (`layout.check_fit` checks them there)."""
    pipeline_schedule: PipelineSchedule = "gpipe"
    """On a mesh with a pipeline axis, the order the stages run micro-batches in, "gpipe" or
    "1f1b". "gpipe" runs every forward, then every backward (with `pipeline_repeats` > 1
    MaxText's circular schedule); "1f1b", after a warm-up, alternates one forward and one
    backward micro-batch a stage (with repeats > 1 interleaved 1F1B, Megatron's virtual
    stages, micro-batches in groups of the stages): the same bubble, a stage keeping the
    inputs of its micro-batches in flight only, at most (R + 1) S - 1 chunks' (2 S - 1
    micro-batches at one repeat, not all M; the step's timetable.py), each layer's ("layer")
    or its chunk's ("iteration"), and recomputing a layer in its backward whatever `remat`
    says."""

    def __post_init__(self) -> None:
        _positive(self.global_batch, "global_batch")
        for name in ("param_dtype", "compute_dtype", "opt_state_dtype"):
            if getattr(self, name) not in DTYPES:
                raise MeshConfigError(
                    f"{name}={getattr(self, name)!r}; accepted: {', '.join(DTYPES)}"
                )
        pairs = _placements(dict(self.remat) if isinstance(self.remat, tuple) else self.remat)
        if not isinstance(self.remat, str):
            named = [n for n in _SAME_STEP if tuple(POLICIES[n].items()) == pairs]
            object.__setattr__(self, "remat", named[0] if named else pairs)
        _positive(self.microbatches, "microbatches")
        _positive(self.logits_chunks, "logits_chunks")
        _count(self.pipeline_microbatches, "pipeline_microbatches")
        _positive(self.pipeline_repeats, "pipeline_repeats")
        _count(self.pipeline_layers, "pipeline_layers")
        if self.global_batch % self.microbatches:
            raise MeshConfigError(
                f"microbatches={self.microbatches} does not divide global_batch="
                f"{self.global_batch}; accepted: a divisor of the global batch"
            )
        if self.attention not in ATTENTION:
            raise MeshConfigError(f"attention={self.attention!r}; accepted: {', '.join(ATTENTION)}")
        if type(self.learning_rate) is not float or not self.learning_rate > 0:
            raise MeshConfigError(
                f"learning_rate={self.learning_rate!r}; accepted: a positive float"
            )
        for name, accepted in (
            ("moe", MOE),
            ("routing", ROUTING),
            ("pipeline_remat", PIPELINE_REMAT),
            ("pipeline_schedule", PIPELINE_SCHEDULES),
            ("quantization", QUANTIZATION),
            ("context_strategy", CONTEXT_STRATEGIES),
        ):
            if getattr(self, name) not in accepted:
                raise MeshConfigError(
                    f"{name}={getattr(self, name)!r}; accepted: {', '.join(accepted)}"
                )
        for flag in ("optimizer_over_data", "context_load_balance"):
            if type(getattr(self, flag)) is not bool:
                raise MeshConfigError(f"{flag}={getattr(self, flag)!r}; accepted: True or False")
        factor = self.capacity_factor
        if type(factor) not in (int, float) or not 0 < factor < math.inf:
            raise MeshConfigError(
                f"capacity_factor={factor!r}; accepted: a positive finite number (the "
                "expert capacity over its even share of tokens; used by moe='capacity')"
            )

    @property
    def placements(self) -> dict[str, str]:
        """Every named tensor of a layer and where the backward pass finds it."""
        return dict(self.remat) if isinstance(self.remat, tuple) else dict(POLICIES[self.remat])

    @property
    def remat_text(self) -> str:
        """The policy as the command line writes it: a name, or the pairs that differ from
        "full" (`layer_input=offload,query=device`)."""
        if isinstance(self.remat, str):
            return self.remat
        full = POLICIES["full"]
        return ",".join(f"{t}={p}" for t, p in self.remat if full[t] != p)


@cache
def field_docs() -> dict[str, str]:
    """Each TrainSpec field's docstring (the string under it, which Sphinx shows), on one line:
    what the command line's flag for the field says."""
    tree = ast.parse(inspect.getsource(TrainSpec))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in pairwise(body):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs
