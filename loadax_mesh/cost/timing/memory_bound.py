"""The step's memory-bound seconds on one device: a layer's norms, rotary, MLP activation
(SwiGLU's gate, or a two-matrix MLP's ReLU or GELU) and residual adds, forward, backward and
the forward again where a tensor is recomputed, at the chip's share of its HBM bandwidth; the
copies of what a layer keeps into the layer scan's stacks and back out; the loss over the
vocabulary; a MoE layer's d_model-wide buffers and the dropless path's row permutes; a
quantized step's absmax and cast passes over what it quantizes (parts/quantized.py); and the
optimizer's update of every parameter shard at the full bandwidth."""

from __future__ import annotations

import math

from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from ..parts import mla
from ..parts.moe import MoeShapes, moe_intermediates
from ..parts.quantized import quantized
from ..parts.shapes import shard_bytes
from .device import Device


def memory_bound(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    d: Device,
    *,
    moe: float,
    again: bool,
    softmax: float,
    permute: float,
    kept_bytes: float,
) -> tuple[float, float]:
    """(a step's memory-bound seconds, a layer's forward elementwise bytes per token). `moe`
    of the layers are MoE layers, `again` whether the backward pass runs a layer's forward
    again, `softmax` plain attention's memory-bound seconds a layer, `permute` a MoE layer's
    row permutes, `kept_bytes` what the layers keep on the device for one micro-batch's
    backward pass (the memory model's "activations")."""
    act, layers = d.act, d.layers
    rot_q, rot_k = d.rotated or (d.q_width, d.kv_width)
    latent = model.attention == "mla"
    extra_fwd, extra_bwd = mla.elementwise(model, d.tensor) if latent else (0, 0)
    fwd_elements, bwd_elements = _layer_elementwise(
        d.stream, rot_q, rot_k, d.d_ff, model.mlp, norms=model.norms
    )
    fwd_elements, bwd_elements = fwd_elements + extra_fwd, bwd_elements + extra_bwd
    elementwise_fwd, elementwise_bwd = fwd_elements * act, bwd_elements * act
    recomputed = elementwise_fwd if again else 0  # the forward recomputed
    loss = logits_accesses(train.logits_chunks > 1) * d.vocab * act
    per_token: float = layers * (elementwise_fwd + elementwise_bwd + recomputed) + loss
    shard = model.num_params / (roles.size("weights") * d.tensor)  # parameters this device updates
    if moe:
        fwd_moe, bwd_moe = (
            (n + extra) * act
            for n, extra in zip(
                _moe_elementwise(model, train, roles, d.stream, rot_q, rot_k),
                (extra_fwd, extra_bwd),
                strict=True,
            )
        )
        moe_again = fwd_moe if again else 0
        per_token = (layers - moe) * (elementwise_fwd + elementwise_bwd + recomputed) + loss
        per_token += moe * (fwd_moe + bwd_moe + moe_again)
    if model.num_experts:
        shard = float(shard_bytes(model, roles, 1, None))  # experts over the expert axis too
    update = shard * update_bytes(train)
    # What the layers keep for the backward pass is copied into the layer scan's stacks and
    # back out each micro-batch: 4 accesses of its bytes (profiled on one H100: the stacks'
    # update and slice fusions, about 4 x the bytes minimal_flash keeps more than full remat,
    # at HBM speed; docs/cost-terms.md).
    stacks = 4 * kept_bytes / d.hbm
    memory = d.micro * (
        d.tokens * per_token / d.streamed + layers * softmax + moe * permute + stacks
    )
    if d.quantized:
        casts_fwd, casts = _casts(model, train, roles, d, moe=moe, again=again)
        return memory + casts + update / d.hbm, elementwise_fwd + casts_fwd
    return memory + update / d.hbm, elementwise_fwd


def _casts(
    model: ModelSpec, train: TrainSpec, roles: Roles, d: Device, *, moe: float, again: bool
) -> tuple[float, float]:
    """A quantized step's absmax and cast passes: (a layer's forward bytes per token, on
    average over its kinds of layer, as the step's forward share reads them at `streamed`;
    the step's seconds). Each tensor quantized is read twice
    in the compute dtype (its absmax, then the cast) and written once in 1 byte: the weights
    and inputs of every forward pass (again where it is recomputed), each matmul's output
    gradient in the backward pass; every micro-batch. Each pass streams a counted byte for
    byte, as Adam's update does: at the full HBM bandwidth (a layer's other memory-bound
    operations run at the chip's measured share of it, for the float32 intermediates XLA's GPU
    fusions move beyond their count: `Device.streamed`)."""
    per = 2 * d.act + d.q_act
    kinds = [(d.layers - moe, quantized(model, train, roles))]
    if moe:
        kinds.append((moe, quantized(model, train, roles, moe=True)))
    forward = sum(n * q.forward for n, q in kinds) * per / d.layers if d.layers else 0.0
    total = sum(n * (q.forward * (1 + again) + q.gradients) for n, q in kinds) * per
    return forward / d.tokens * d.streamed / d.hbm, d.micro * total / d.hbm


def _layer_elementwise(
    stream: int, q_width: int, kv_width: int, d_ff: int, mlp: str, *, norms: int = 2
) -> tuple[int, int]:
    """Activation elements a layer's memory-bound operations read and write per token, forward
    and backward. Forward: `norms` RMSNorms (two; a parallel block's one), each reading the
    stream and writing it, two residual adds (each reads two streams, writes one), rotary (q
    and k read and written), the MLP's activation: the SwiGLU gate (gate and up read, their
    product written), a two-matrix MLP's ReLU or GELU (up read, its activation written).
    Backward: each norm reads its input and its output's gradient and writes its input's, each
    add reads the two gradients it sums and writes the sum, rotary reads and writes the
    gradients of q and k, the gate reads gate, up and the product's gradient and writes the
    gradients of gate and up, a ReLU or GELU reads up (or its sign) and the activation's
    gradient and writes up's."""
    rotary = 2 * (q_width + kv_width)
    gate_fwd, gate_bwd = (3 * d_ff, 5 * d_ff) if mlp == "swiglu" else (2 * d_ff, 3 * d_ff)
    norms_fwd, adds_fwd = norms * (stream + stream), 2 * (2 * stream + stream)
    norms_bwd, adds_bwd = norms * 3 * stream, 2 * 3 * stream
    return norms_fwd + adds_fwd + rotary + gate_fwd, norms_bwd + adds_bwd + rotary + gate_bwd


def _moe_elementwise(
    model: ModelSpec, train: TrainSpec, roles: Roles, stream: int, q_width: int, kv_width: int
) -> tuple[float, float]:
    """A MoE layer's memory-bound elements per token, forward and backward: a dense layer's
    (`_layer_elementwise`) with the SwiGLU gate over the rows its experts compute (capacity
    padding included) and its shared experts, and every d_model-wide buffer of the block (the
    sorted copies, dispatch buffers, the experts' output, the results combined and unsorted,
    the weighted sum) written and read once each pass."""
    ms = MoeShapes.of(model, train, roles)
    shared = model.num_shared_experts * model.moe_d_ff // roles.size("model")
    width = ms.rows * ms.width / ms.tokens + shared
    fwd, bwd = _layer_elementwise(stream, q_width, kv_width, round(width), "swiglu")
    rows = train.global_batch // roles.size("batch")
    r, s = max(1, rows // train.microbatches), model.seq_len // roles.size("seq")
    found = moe_intermediates(model, train, roles, r, s)
    wide = sum(math.prod(shape) for shape, _ in found.values() if shape[-1] == model.d_model)
    return fwd + 2 * wide / ms.tokens, bwd + 2 * wide / ms.tokens


def logits_accesses(chunked: bool) -> int:
    """How often the loss reads or writes the logits: written, read twice, their gradient read
    and written; chunked, each chunk's logits are recomputed in the backward pass (written and
    read once more)."""
    return 1 + 2 + 2 + 2 * chunked


def update_bytes(train: TrainSpec) -> int:
    """Bytes Adam's update moves per parameter: the parameter and its gradient read, both
    moments read and written, the parameter written; with micro-batches also the float32
    gradient accumulator read and written."""
    param, moment = dtype_bytes(train.param_dtype), dtype_bytes(train.opt_state_dtype)
    accumulator = 2 * dtype_bytes("float32") if train.microbatches > 1 else 0
    return 2 * param + 4 * moment + param + accumulator
