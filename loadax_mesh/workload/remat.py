"""What the reference step's backward pass keeps and what it makes again: the layer's checkpoint
policy (where each named tensor of a layer waits for the backward pass, TrainSpec's remat
placements), and the projection whose backward pass gathers its weight again.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .spec import TrainSpec


def remat_policy(train: TrainSpec) -> Any:
    """The layer's checkpoint policy, None for no checkpoint ("none": everything saved).

    "full" and "dots" keep jax's own policies (nothing saved inside the layer; matmul outputs
    without batch dims saved), against which the memory model was calibrated; they save what
    the per-tensor form of their placements would. Any other placement (a mapping, or
    "offload") saves its "device" tensors in HBM and moves its "offload" ones to host memory
    (`pinned_host`) for the backward pass; the rest is recomputed.

    With low-precision matmuls (quantization "fp8", "int8") "dots" saves the named matmul
    outputs and the other matmuls' outputs: jax's policy would save a quantized matmul's
    unscaled float32 or int32 product (`quantized.py`) instead of its output.
    """
    policies = jax.checkpoint_policies
    if train.remat == "none":
        return None
    if train.remat == "full":
        return policies.nothing_saveable
    if train.remat == "dots" and train.quantization != "none":
        # the layer input is the checkpointed function's argument: there whatever the policy
        named = [t for t, p in train.placements.items() if p == "device" and t != "layer_input"]
        return policies.save_from_both_policies(
            _unquantized_dots, policies.save_only_these_names(*named)
        )
    if train.remat == "dots":
        return policies.dots_with_no_batch_dims_saveable
    where = train.placements
    return policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[t for t, p in where.items() if p == "device"],
        names_which_can_be_offloaded=[t for t, p in where.items() if p == "offload"],
        offload_src="device",
        offload_dst="pinned_host",
    )


def _unquantized_dots(prim: Any, *avals: Any, **params: Any) -> bool:
    """jax's `dots_with_no_batch_dims_saveable` for matmuls of float operands only."""
    low = any(jnp.dtype(a.dtype).itemsize == 1 for a in avals)
    return not low and jax.checkpoint_policies.dots_with_no_batch_dims_saveable(
        prim, *avals, **params
    )


def stage_policy(train: TrainSpec) -> Any:
    """The policy a pipeline's schedule checkpoints under: the layer's (pipeline_remat
    "layer"), or for one checkpoint an iteration ("iteration") the layer's with each layer's
    input saved too (MaxText's decoder_layer_input), since a chunk's layers are then not
    checkpointed one by one; None for "none"."""
    policy = remat_policy(train)
    if policy is None or train.pipeline_remat == "layer":
        return policy
    inputs = jax.checkpoint_policies.save_only_these_names("layer_input")
    return jax.checkpoint_policies.save_from_both_policies(policy, inputs)


@jax.custom_vjp
def _regathered_projection(h: jax.Array, w: jax.Array) -> jax.Array:
    """`bsd,dhk->bshk` of `h` and the stored weight `w` cast to h's dtype, whose backward pass
    gathers `w` again: the barrier hides that the sharded weight is the forward's, so XLA
    cannot reuse the gathered copy. Reused, libtpu holds the recompute's gathered q, k and v
    through the MLP's recompute and backward (0.9 GB on GPT-3 175B at fsdp 256, which then
    does not fit v6e's HBM); MaxText's step gathers them again. Same values as the einsum."""
    return jnp.einsum("bsd,dhk->bshk", h, w.astype(h.dtype))


def _regathered_forward(h: jax.Array, w: jax.Array) -> tuple[jax.Array, Any]:
    return _regathered_projection(h, w), (h, w)


def _regathered_backward(res: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    h, w = res
    again = jax.lax.optimization_barrier(w)
    dh = jnp.einsum("bshk,dhk->bsd", g, again.astype(h.dtype))
    return dh, jnp.einsum("bsd,bshk->dhk", h, g).astype(w.dtype)


_regathered_projection.defvjp(_regathered_forward, _regathered_backward)
