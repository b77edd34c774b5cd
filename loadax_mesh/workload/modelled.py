"""Which model shapes the reference step builds and the cost model prices: the rest is refused
by name, not priced or compiled as a model it is not. Pure Python (the cost model reads it).
"""

from __future__ import annotations

from ..errors import MeshConfigError
from .spec import ModelSpec

# The shape the reference step builds, and with it the cost model prices: every layer dense,
# grouped-query attention, any of ModelSpec's MLPs (SwiGLU, or two matrices with ReLU or GELU),
# global or local attention (ModelSpec.sliding_window and global_every: the step's cycle.py).
# (num_heads * head_dim may differ from d_model: the step's projections take heads and head_dim
# apart; tied embeddings are one table, looked up and transposed for the logits.)
MODELLED = (("num_experts", 0), ("attention", "gqa"))


def check_modelled(
    model: ModelSpec,
    by: str = "the reference step and the cost model",
    *,
    experts: bool = False,
    latent: bool = False,
) -> None:
    """A MeshConfigError for a model whose layers `by` do not build yet (experts, latent
    attention): refused, not priced or compiled as a model it is not. `experts`: `by` builds
    MoE layers (the reference step does, moe.py: SwiGLU experts; the cost model prices them,
    cost/parts/moe.py); `latent`: `by` builds multi-head latent attention (the step, step.py's
    `mla.latent_qkv`; the cost model, cost/parts/mla.py)."""
    accepted = ", ".join(f"{f}={v!r}" for f, v in MODELLED)
    built_too = {"num_experts": experts, "attention": latent}
    for field, built in MODELLED:
        value = getattr(model, field)
        if value != built and not built_too[field]:
            raise MeshConfigError(
                f"model {model.name!r}: {field}={value!r} is not modelled yet by {by}; "
                f"accepted: dense GQA models ({accepted})"
                + (", or such models with SwiGLU experts" if experts else "")
                + (" or latent attention" if latent else "")
            )
    if model.parallel_block and (model.num_experts or model.attention != "gqa"):
        raise MeshConfigError(
            f"model {model.name!r}: parallel_block=True with num_experts={model.num_experts}, "
            f"attention={model.attention!r} is not modelled yet by {by}; accepted: a parallel "
            "block in a dense GQA model"
        )
    if experts and model.num_experts and model.mlp != "swiglu":
        raise MeshConfigError(
            f"model {model.name!r}: mlp={model.mlp!r} with num_experts={model.num_experts} is "
            f"not modelled yet by {by}; accepted: SwiGLU experts (mlp='swiglu')"
        )
