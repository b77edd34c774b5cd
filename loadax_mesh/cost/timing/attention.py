"""The step's attention seconds on one device. The fused kernels (TPU: jax's splash kernels;
GPU: cuDNN's) are priced by their FLOPs over the query-key pairs the mask keeps on the busiest
shard of the sequence (parts/context.py: windows, load balance) at the kernel's rate, or their
operands' bytes where that is longer; the forward runs again in every checkpointed
layer, its output kept or not (parts/saved.py `runs_again`). Plain attention
(`TrainSpec.attention`, parts/plain_attention.py) computes the whole square: its matmuls
priced as a projection is, its softmax and the softmax's gradient memory-bound over the
score-sized tensors."""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.profile import DeviceFacts
from ...hardware.traits import attention_kernel
from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from ..parts.context import mean_pairs
from ..parts.plain_attention import Pass, PlainAttention, plain_attention, ring_attention
from .device import Device, whole

# FLOPs per causal query-key pair, forward and backward, by the platform's fused kernel (the
# kernels' own matmuls; see compiler/roofline.py), as (per unit of the query/key head_dim, per
# unit of the value's): forward QK^T and PV; splash's backward recomputes QK^T in its dq and
# its dkv kernel and dO V^T in both (4 + 4 per pair and head_dim when the two are alike, 14 in
# all), cuDNN's once (10), whose count other kernels take.
_PER_PAIR = {"splash": ((2, 2), (8, 6)), "cudnn": ((2, 2), (6, 4))}


@dataclass(frozen=True)
class Attention:
    """A micro-batch's attention seconds: every layer's kernels (or plain attention's matmuls)
    in all and one layer's forward, and plain attention's memory-bound seconds, a layer's in
    all and forward (0 for a fused kernel)."""

    seconds: float
    forward: float
    softmax: float
    softmax_forward: float


def attention(
    model: ModelSpec, train: TrainSpec, roles: Roles, facts: DeviceFacts, d: Device, *, again: bool
) -> Attention:
    """`again`: the backward pass runs the attention's forward again (`runs_again`)."""
    # q, k, v read, output written
    kernel_bytes = d.tokens * (d.q_width + d.kv_width + (d.kv_heads + d.heads) * d.v_dim) * d.act
    # Each of the kernel's matmuls has head_dim as its contraction (QK^T) or output (PV, dQ,
    # dK, dV) dim: a head narrower than the matrix unit leaves the rest of it idle.
    unit = max(d.mxu)
    widths = whole(model.head_dim, unit), whole(d.v_dim, unit)
    if attention_kernel(train.attention, facts.platform) == "plain":
        return _plain(model, train, roles, d, widths, kernel_bytes)
    if train.context_strategy == "ring" and roles.size("seq") > 1:
        return _ring(model, train, roles, d, widths, kernel_bytes)
    fwd_pair, bwd_pair = _PER_PAIR.get(facts.traits.fused_attention, _PER_PAIR["cudnn"])
    # the query-key pairs a micro-batch's rows keep on the busiest shard of the sequence
    balanced = train.context_load_balance
    pairs = d.rows // d.micro * mean_pairs(model, roles.size("seq"), balanced=balanced)

    def kernel(per_pair: tuple[int, int]) -> float:
        """One pass of the flash kernel: its FLOPs over the pairs, or its operands' bytes."""
        flops = pairs * d.heads * (per_pair[0] * widths[0] + per_pair[1] * widths[1])
        return max(flops / d.kernel_rate, kernel_bytes / d.hbm)

    seconds = d.layers * (kernel(fwd_pair) * (1 + again) + kernel(bwd_pair))
    return Attention(seconds, kernel(fwd_pair), 0.0, 0.0)


def _plain(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    d: Device,
    widths: tuple[int, int],
    kernel_bytes: float,
) -> Attention:
    """Plain attention over the whole square: a micro-batch's rows x heads x this device's
    queries x every key."""
    squares = d.rows // d.micro * d.heads * (model.seq_len // roles.size("seq")) * model.seq_len
    return _written_out(d, squares, plain_attention(model, train, widths=widths), kernel_bytes)


def _ring(
    model: ModelSpec,
    train: TrainSpec,
    roles: Roles,
    d: Device,
    widths: tuple[int, int],
    kernel_bytes: float,
) -> Attention:
    """Ring attention (workload/ring.py): XLA's tiles over the pairs the busiest shard keeps
    (the tiles the mask excludes skipped), priced as written-out attention is."""
    balanced = train.context_load_balance
    kept = d.rows // d.micro * d.heads * mean_pairs(model, roles.size("seq"), balanced=balanced)
    return _written_out(d, kept, ring_attention(model, train, widths=widths), kernel_bytes)


def _written_out(d: Device, squares: float, att: PlainAttention, kernel_bytes: float) -> Attention:
    """Attention whose score tensors XLA writes out: `squares` score elements a layer pass."""
    passes = att.passes

    def priced(p: Pass) -> tuple[float, float]:
        """(matmul seconds, memory-bound seconds) of one of a layer's passes; a matmul reads or
        writes one score-sized tensor and two of the head-sized operands."""
        matmuls = sum(
            max(squares * f / d.rate, (squares * b + kernel_bytes / 2) / d.hbm)
            for f, b in p.matmuls
        )
        return matmuls, squares * p.elementwise / d.streamed

    each = [priced(p) for p in passes]
    forward, softmax_forward = each[0]
    return Attention(
        d.layers * sum(m for m, _ in each), forward, sum(e for _, e in each), softmax_forward
    )
