"""Attention written out (`TrainSpec(attention="plain")`) as the reference step runs it
(workload/attention.py `_plain`), counted from its operations rather than priced as a fused
kernel.

Per layer the step writes out a score-sized tensor ([rows, heads, queries, keys]) at every
operation that cannot fuse with the next: the two matmuls of the forward pass over the whole
square (the causal mask is applied to the scores, not used to skip any), the softmax's three
passes over the scores (its row max, its row sum of exponentials, the normalised weights; the
float32 cast, scale and mask fused into each), and in the backward pass three matmuls more
(the weights' gradient, the values' and, from the scores' gradient, the queries' and keys')
and the softmax's gradient (its row sum of gradient x probabilities, then the scores'
gradient). The backward pass reads the probabilities: under every checkpoint policy no named
tensor keeps them, so the scores and weights are computed again (and the weighted values too
where the attention's output is recomputed); with no checkpoint at all autodiff saves the
float32 probabilities (cost/parts/saved.py `residuals`) and the backward pass reads those.

The matmuls are ordinary matmuls; the rest is memory-bound. Counted per score element, one
pair of one head, in bytes (compute dtype `c`):

- forward: q.k^T writes the scores (c); the softmax reads them three times and writes the
  weights (4c); weights.v reads them (c)
- again (any checkpoint): q.k^T (c) and the softmax (4c); weights.v (c) where the
  attention's output is recomputed
- backward: dO.v^T writes the weights' gradient (c), weights^T.dO reads the weights (c), the
  scores' gradient is read by its two matmuls (2c); the softmax's gradient reads the weights'
  gradient twice (2c) and the probabilities' source twice (the scores, 2c; with no checkpoint
  the saved float32 probabilities, 8 bytes) and writes the scores' gradient (c)

XLA's GPU compiler moves more than this (it writes float32 copies of the scores and of the
weights' gradient and the scores' gradient in two layouts), which the chip's measured share of
its HBM bandwidth for memory-bound operations covers, as for every other such count
(cost/timing/step.py); libtpu fuses more (benchmarks/RESULTS.md, 2026-11-29).
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
