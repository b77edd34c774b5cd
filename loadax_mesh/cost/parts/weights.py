"""How many weights one layer holds on a device once gathered over FSDP (elements): what its
gathers move and what the layer loop holds of them."""

from __future__ import annotations

from ...workload.layout import Roles
from ...workload.spec import ModelSpec
from .mla import attention_weights


def dense_layer_weights(model: ModelSpec, m: int) -> int:
    """A dense layer's weights on one device once gathered over FSDP (elements): its attention
    and MLP, the norms not gathered (a dense model's every layer)."""
    return attention_weights(model, m) + model.mlp_params(model.d_ff) // m


def moe_layer_weights(model: ModelSpec, roles: Roles) -> tuple[int, int]:
    """A MoE layer's weights on one device once gathered (elements): (attention, router and
    shared experts, gathered over fsdp and the expert axis; its routed experts, E / P of them
    with an expert axis of size P, else all E, each cut over the tensor axis)."""
    m = roles.size("model")
    shared = model.num_shared_experts * model.mlp_params(model.moe_d_ff)
    dense = attention_weights(model, m) + model.d_model * model.num_experts + shared // m
    experts = model.num_experts // roles.size("expert") * model.mlp_params(model.moe_d_ff) // m
    return dense, experts
