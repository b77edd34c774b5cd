"""What the reference step trains: a model's shape (`ModelSpec`, in model.py) and how it trains
(`TrainSpec`). Pure Python: the cost model reads these without jax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MeshConfigError
from .model import ModelSpec as ModelSpec
from .model import _count, _positive
from .model import list_models as list_models

DTYPES = ("float32", "bfloat16")
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
ATTENTION = ("flash", "plain")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# How a step runs MoE layers (TrainSpec).
MOE = ("dropless", "capacity")
ROUTING = ("learned", "balanced")
# Where a pipelined step checkpoints (TrainSpec.pipeline_remat).
PIPELINE_REMAT = ("layer", "iteration")


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
    """How a step trains: the global batch (sequences), dtypes, attention and the recipe
    (remat placement, micro-batches, logits chunks).

    Parameters are kept in `param_dtype` and computed in `compute_dtype`; Adam's two moments are
    kept in `opt_state_dtype`. `attention`: "flash" is jax's splash kernel on TPU and
    `jax.nn.dot_product_attention` elsewhere (cuDNN on GPU); "plain" writes the score matrix
    out in XLA.

    `remat` places each named tensor of a layer (TENSORS) for the backward pass: "recompute",
    "device" (saved in HBM) or "offload" (saved in host memory). A policy name is a shorthand:
    "full" saves only the layer input, "dots" also the matmul outputs, "dots_attention" also
    the attention's output (every named tensor), "none" everything (no checkpoint), "offload"
    the layer input in host memory. A mapping names some tensors (the rest are
    recomputed, the layer input kept on the device) and is stored as the policy name it equals
    (except "none", which checkpoints nothing, unnamed intermediates included), or else as
    (tensor, placement) pairs for every tensor. `microbatches`: gradient
    accumulation, the step's batch run in that many sequential slices, gradients summed.
    `logits_chunks`: the loss computed over that many slices of the tokens, so the
    [tokens, vocab] logits never exist whole.

    MoE layers (a model with experts): `moe` "dropless" gives every expert all the tokens
    routed to it; "capacity" gives each at most `capacity_factor` times its even share and
    drops the rest. `routing` "learned" follows the router; "balanced" spreads tokens evenly
    over the experts, as published MoE benchmark runs force it.

    Pipeline stages (a mesh axis named `pipeline`, docs/design.md section 12):
    `pipeline_microbatches` micro-batches flow through the stages (0: as many as stages);
    `pipeline_repeats` 1 is GPipe, more is the circular schedule (each stage holds that many
    non-adjacent chunks of layers: MaxText's num_pipeline_repeats, Megatron's virtual stages);
    `pipeline_layers` how many of the last decoder layers are pipelined (0: every one), the
    layers before them run with the pipeline axis acting as data; `pipeline_remat` where the
    stages checkpoint under `remat`: "layer" each layer (a layer's backward pass holds one
    layer's recomputed intermediates), "iteration" one checkpoint around a stage's chunk of
    layers an iteration, each layer's input saved (MaxText's pipeline: the backward pass of
    a chunk holds all its layers' intermediates at once). All four are read only on a mesh
    whose pipeline axis is larger than 1 (`layout.check_fit` checks them there).

    Raises:
        MeshConfigError: when built with an invalid field (a batch that is not a positive int,
            an unknown dtype, remat policy, tensor or placement, MoE option, ...).
    """

    global_batch: int
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    opt_state_dtype: str = "float32"
    remat: str | tuple[tuple[str, str], ...] = "full"
    attention: str = "flash"
    learning_rate: float = 1e-3
    microbatches: int = 1
    logits_chunks: int = 1
    moe: str = "dropless"
    capacity_factor: float = 1.25
    routing: str = "learned"
    pipeline_microbatches: int = 0
    pipeline_repeats: int = 1
    pipeline_layers: int = 0
    pipeline_remat: str = "layer"

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
        ):
            if getattr(self, name) not in accepted:
                raise MeshConfigError(
                    f"{name}={getattr(self, name)!r}; accepted: {', '.join(accepted)}"
                )
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
