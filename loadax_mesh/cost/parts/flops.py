"""FLOPs of the reference step per device: executed (remat recompute included), the model's
own, and the recompute (what `estimate` reports and the compiler's count referees)."""

from __future__ import annotations

from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from . import mla
from .context import window_share
from .moe import expert_rows, moe_op_flops
from .plain_attention import again_flops, square_flops
from .saved import runs_again
from .shapes import Shapes


def op_flops(model: ModelSpec) -> dict[str, float]:
    """FLOPs per token of the op producing each named tensor of a layer (2 per weight; causal
    attention: half of 4 * seq * heads * head_dim, less what sliding windows leave out,
    `window_share`, averaged over the layers; the MLP's input: SwiGLU's gate and up, or a
    two-matrix MLP's up); norms, rotary and activations count 0. Latent attention's ops:
    cost/parts/mla.py."""
    d, hd, f = model.d_model, model.head_dim, model.d_ff
    inputs = 2 if model.mlp == "swiglu" else 1
    h, kv = model.num_heads, model.num_kv_heads
    latent = mla.op_flops(model) if model.attention == "mla" else {}
    return {
        "layer_input": 0.0,
        "query": 2.0 * d * h * hd,
        "key": 2.0 * d * kv * hd,
        "value": 2.0 * d * kv * hd,
        "attention_out": 2.0 * model.seq_len * h * hd * window_share(model),
        "out_proj": 2.0 * h * hd * d,
        "mlp_in": 2.0 * inputs * d * f,
        "mlp_out": 2.0 * f * d,
    } | latent


def executed_op_flops(model: ModelSpec, train: TrainSpec) -> dict[str, float]:
    """`op_flops` as the step executes them: plain attention (`TrainSpec.attention`) computes
    the whole square, the masked half too (cost/parts/plain_attention.py)."""
    ops = op_flops(model)
    if train.attention == "plain":
        ops["attention_out"] = square_flops(model)
    return ops


def again_op_flops(
    model: ModelSpec, train: TrainSpec, ops: dict[str, float], *, moe: bool = False
) -> float:
    """FLOPs per token of the ops the backward pass runs again (`saved.runs_again`), from
    `ops`; plain attention's as cost/parts/plain_attention.py counts them (its weighted values only
    where the attention's output is recomputed)."""
    names = runs_again(train, moe=moe, parallel=model.parallel_block)
    if train.attention != "plain":
        return sum(ops[t] for t in names)
    return sum(ops[t] for t in names if t != "attention_out") + again_flops(model, train)


def step_flops(
    model: ModelSpec, train: TrainSpec, r: Roles, *, grouped: str = "libtpu"
) -> tuple[float, float, float]:
    """(FLOPs executed, model FLOPs, recompute FLOPs) per device per step. A layer's forward is
    the sum of its ops (`op_flops`), the head's 2 per vocabulary weight per token; the backward
    pass is twice the forward. A MoE layer's MLP is `moe_op_flops`' (the rows its experts
    execute, not the model's), its experts' weight gradients over the rows `expert_rows` gives
    them (`grouped`: how the platform runs them, `PlatformTraits.grouped_matmul`). The backward
    pass runs again the op of every tensor the remat placement recomputes and the backward pass
    reads (saved.runs_again: under "full" the whole layer but a dense layer's down projection
    and a parallel block's output projection; under every policy but "none" the attention
    kernel's forward), and, with chunked logits, the head of each chunk
    (the chunk's logits are recomputed, not saved). Plain attention executes the whole square
    (`executed_op_flops`); the model's own FLOPs count the causal half."""
    sh = Shapes.of(model, train, r)
    m = r.size("model")
    ops, own = executed_op_flops(model, train), op_flops(model)
    layer = sum(ops.values())
    head = 2 * model.vocab_size * model.d_model
    again = again_op_flops(model, train, ops)
    if model.num_experts:  # its dense layers as above, its MoE layers with their own MLP
        dense, moe = model.num_layers - model.num_moe_layers, model.num_moe_layers
        mixed = ops | moe_op_flops(model, train, r, grouped=grouped)
        useful = own | moe_op_flops(model, train, r, executed=False)
        forward = sh.tokens * (dense * layer + moe * sum(mixed.values()) + head) / m
        rows, gradient_rows = expert_rows(model, train, r, grouped=grouped)
        experts = 2.0 * model.mlp_params(model.moe_d_ff)  # per row, forward
        wider = sh.tokens * moe * experts * (gradient_rows - rows) / m  # the weight gradient's
        model_fwd = sh.tokens * (dense * layer + moe * sum(useful.values()) + head) / m
        moe_again = again_op_flops(model, train, mixed, moe=True)
        again_all = dense * again + moe * moe_again
        recompute = sh.tokens * (again_all + head * (train.logits_chunks > 1)) / m
        return 3 * forward + wider + recompute, 3 * model_fwd, recompute
    forward = sh.tokens * (model.num_layers * layer + head) / m
    model_fwd = sh.tokens * (model.num_layers * sum(own.values()) + head) / m
    recompute = sh.tokens * (model.num_layers * again + head * (train.logits_chunks > 1)) / m
    return 3 * forward + recompute, 3 * model_fwd, recompute


def layer_flops(
    model: ModelSpec, train: TrainSpec, r: Roles, *, grouped: str, moe: bool
) -> tuple[float, float]:
    """FLOPs per token of one layer pass as flops.step_flops counts them: (forward, backward
    and recompute; the recompute), a MoE layer's (`moe`) with its MLP's ops and its experts'
    weight gradients over the rows `expert_rows` gives them, on a micro-batch of `train`."""
    ops = executed_op_flops(model, train)
    if not moe:
        again = again_op_flops(model, train, ops)
        return 3 * sum(ops.values()) + again, again
    mixed = ops | moe_op_flops(model, train, r, grouped=grouped)
    rows, gradient_rows = expert_rows(model, train, r, grouped=grouped)
    wider = 2.0 * model.mlp_params(model.moe_d_ff) * (gradient_rows - rows)
    again = again_op_flops(model, train, mixed, moe=True)
    return 3 * sum(mixed.values()) + wider + again, again
