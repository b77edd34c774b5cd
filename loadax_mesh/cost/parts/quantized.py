"""What a quantized step (`TrainSpec.quantization`) quantizes in one layer, for one micro-batch
on one device, counted in elements: the weights of its projections and MLP matmuls (the routed
and shared experts' too) as gathered in the compute dtype, their distinct inputs (q, k and v
read one norm, SwiGLU's gate and up another, a parallel block's MLP the first: quantized once
each) and, in the backward pass, each matmul's output gradient. The head, the router, the
dispatch einsums and attention stay in the compute dtype. Priced by timing/memory_bound.py (the
absmax and cast passes) and held by memory/terms.py (the quantized copies)."""

from __future__ import annotations

from dataclasses import dataclass

from ...workload.layout import Roles
from ...workload.spec import ModelSpec, TrainSpec
from . import mla
from .moe import MoeShapes


@dataclass(frozen=True)
class Quantized:
    """One layer's quantized operands (elements): its weights, its matmuls' distinct inputs and
    their output gradients; `widest` the largest single output gradient (of one matmul)."""

    weights: int
    inputs: int
    gradients: int
    widest: int

    @property
    def forward(self) -> int:
        """What the forward pass quantizes (again where it is recomputed)."""
        return self.weights + self.inputs


def projection_shapes(model: ModelSpec, m: int) -> dict[str, list[tuple[int, int]]]:
    """A dense layer's projection and MLP matmuls on one device, each [tokens, k] x [k, n] as
    (k, n), grouped by the tensor they read (cost/timing/matmuls.py prices the same shapes)."""
    d, hd = model.d_model, model.head_dim
    q_width, kv_width = model.num_heads // m * hd, model.num_kv_heads // m * hd
    if model.attention == "mla":
        shapes: list[tuple[int, int]] = []

        def record(k: int, n: int) -> float:
            shapes.append((k, n))
            return 0.0

        mla.projections(model, m, record)
        attention, out = shapes[:-1], shapes[-1:]  # its out_proj is the last
    else:
        attention, out = [(d, q_width), (d, kv_width), (d, kv_width)], [(q_width, d)]
    inputs = 2 if model.mlp == "swiglu" else 1
    return {
        "attention": attention,
        "out_proj": out,
        "mlp_in": [(d, model.d_ff // m)] * inputs,
        "mlp_out": [(model.d_ff // m, d)],
    }


# A tensor quantized once and the matmuls that read it: (its elements, [(each matmul's output
# elements, its weight elements)])
Reader = tuple[int, list[tuple[int, int]]]


def quantized(model: ModelSpec, train: TrainSpec, roles: Roles, *, moe: bool = False) -> Quantized:
    """One layer's quantized operands (a MoE layer's with `moe`); zeros unquantized."""
    if train.quantization == "none":
        return Quantized(0, 0, 0, 0)
    m = roles.size("model")
    rows = train.global_batch // roles.size("batch")
    t = max(1, rows // train.microbatches) * (model.seq_len // roles.size("seq"))
    readers: list[Reader] = []
    for name, shapes in projection_shapes(model, m).items():
        if moe and name.startswith("mlp"):
            continue
        # a group's matmuls that contract the same dim read the same tensor; a parallel
        # block's MLP reads the attention's norm, quantized for q, k and v already
        shared = name == "mlp_in" and model.parallel_block
        for k in dict.fromkeys(k for k, _ in shapes):
            reads = [(t * n, k * n) for k_, n in shapes if k_ == k]
            readers.append((0 if shared else t * k, reads))
    if moe:
        readers += _experts(model, train, roles, t)
    outputs = [out for _, reads in readers for out in reads]
    return Quantized(
        weights=sum(w for _, w in outputs),
        inputs=sum(x for x, _ in readers),
        gradients=sum(y for y, _ in outputs),
        widest=max(y for y, _ in outputs),
    )


def _experts(model: ModelSpec, train: TrainSpec, roles: Roles, t: int) -> list[Reader]:
    """A MoE layer's expert matmuls as readers: the rows its experts compute (capacity padding
    included), through gate and up and then down, each of its E / P experts' weights; and the
    shared experts on every token."""
    ms, d = MoeShapes.of(model, train, roles), model.d_model
    w, g = ms.width, ms.groups
    found: list[Reader] = [
        (ms.rows * d, [(ms.rows * w, g * d * w)] * 2),
        (ms.rows * w, [(ms.rows * d, g * w * d)]),
    ]
    shared = model.num_shared_experts * model.moe_d_ff // roles.size("model")
    if shared:
        found += [(t * d, [(t * shared, d * shared)] * 2), (t * shared, [(t * d, shared * d)])]
    return found
