"""Attention written out (`TrainSpec(attention="plain")`) as the reference step runs it
(workload/attention.py `_plain`), counted from its operations rather than priced as a fused
kernel (the full count and what the compilers do beyond it: docs/cost-terms.md).

Per layer the step writes out a score-sized tensor ([rows, heads, queries, keys]) at every
operation that cannot fuse with the next: the forward pass's two matmuls over the whole square
(the causal mask applied to the scores, skipping none) and the softmax's three passes; the
backward pass's three matmuls more and the softmax's gradient. The backward pass reads the
probabilities: under every checkpoint policy the scores and weights are computed again (and
the weighted values where the attention's output is recomputed); with no checkpoint at all
autodiff saves the float32 probabilities (parts/saved.py `residuals`).

The matmuls are ordinary matmuls; the rest is memory-bound, counted per score element (one
pair of one head) in bytes of the compute dtype (`Pass`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes
from .saved import recomputed


@dataclass(frozen=True)
class Pass:
    """One pass of a layer's plain attention over the whole square: its matmuls, each as
    (FLOPs, bytes of the score-sized tensor it reads or writes) per score element, and the
    bytes its memory-bound operations read and write per score element."""

    matmuls: tuple[tuple[float, float], ...]
    elementwise: float

    @property
    def score_bytes(self) -> float:
        """Every byte of a score-sized tensor the pass reads or writes, per score element."""
        return sum(b for _, b in self.matmuls) + self.elementwise


@dataclass(frozen=True)
class PlainAttention:
    """A layer's plain attention, pass by pass (`forward`, `again` for the backward pass's
    recompute, `backward`), per score element."""

    forward: Pass
    again: Pass
    backward: Pass

    @property
    def passes(self) -> tuple[Pass, Pass, Pass]:
        return self.forward, self.again, self.backward


def plain_attention(
    model: ModelSpec, train: TrainSpec, *, widths: tuple[int, int] | None = None
) -> PlainAttention:
    """The passes of one layer's plain attention under `train`'s recipe (see the module);
    `widths`: the head dims (q.k^T's contraction, the values') as the matrix unit computes
    them, where it pads them to whole tiles (default: the model's)."""
    c = float(dtype_bytes(train.compute_dtype))
    qk, v = widths or _widths(model)
    scores, weighted = (2.0 * qk, c), (2.0 * v, c)  # q.k^T, weights.v (and each gradient)
    checkpointed = train.remat != "none"
    output_again = "attention_out" in recomputed(train, parallel=model.parallel_block)
    again = (
        Pass(matmuls=(scores, weighted) if output_again else (scores,), elementwise=4 * c)
        if checkpointed
        else Pass(matmuls=(), elementwise=0.0)
    )
    probabilities = 2 * c if checkpointed else 2 * 4.0
    return PlainAttention(
        forward=Pass(matmuls=(scores, weighted), elementwise=4 * c),
        again=again,
        # dO.v^T, weights^T.dO, dS.k, dS^T.q
        backward=Pass(
            matmuls=(weighted, weighted, scores, scores),
            elementwise=2 * c + probabilities + c,
        ),
    )


def ring_attention(
    model: ModelSpec, train: TrainSpec, *, widths: tuple[int, int] | None = None
) -> PlainAttention:
    """The passes of one layer's ring attention (workload/ring.py: XLA einsums over tiles of
    the pairs the mask keeps, a float32 online softmax), per kept score element: forward
    q.k^T and weights.v with the softmax's passes in float32; again where a checkpoint reruns
    the attention; backward (flash attention's custom VJP) q.k^T and the weights recomputed
    from the log-sum-exp, then dO.v^T, weights^T.dO, dS.k and dS^T.q."""
    qk, v = widths or _widths(model)
    f32 = 4.0
    scores, weighted = (2.0 * qk, f32), (2.0 * v, f32)
    forward = Pass(matmuls=(scores, weighted), elementwise=4 * f32)
    again = forward if train.remat != "none" else Pass(matmuls=(), elementwise=0.0)
    backward = Pass(matmuls=(scores, weighted, weighted, scores, scores), elementwise=4 * f32)
    return PlainAttention(forward=forward, again=again, backward=backward)


def _widths(model: ModelSpec) -> tuple[int, int]:
    """The contraction dim of q.k^T (head_dim) and the values' width (latent attention's
    v_head_dim)."""
    v = model.v_head_dim if model.attention == "mla" else model.head_dim
    return model.head_dim, v


def square_flops(model: ModelSpec) -> float:
    """FLOPs per token of one forward pass of plain attention over the whole square: q.k^T and
    weights.v over every key (twice the causal count `flops.op_flops` gives the model)."""
    qk, v = _widths(model)
    return 2.0 * model.seq_len * model.num_heads * (qk + v)


def again_flops(model: ModelSpec, train: TrainSpec) -> float:
    """FLOPs per token the backward pass runs again of plain attention: q.k^T under any
    checkpoint, and weights.v where the attention's output is recomputed."""
    if train.remat == "none":
        return 0.0
    qk, v = _widths(model)
    output = "attention_out" in recomputed(train, parallel=model.parallel_block)
    return 2.0 * model.seq_len * model.num_heads * (qk + v * output)
