"""What the backward pass runs again under each remat policy, read from the jaxpr of the
reference step's gradient, against the cost model's count (cost/saved.recomputed)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.sharding import Mesh

from loadax_mesh.cost.parts.flops import op_flops, step_flops
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.layout import roles
from loadax_mesh.workload.step import make_step

from .losses import TINY
from .test_moe import MOE


def _matmuls(jaxpr: Any, times: int, out: dict[str, float]) -> None:
    """FLOPs of the jaxpr's matmuls by kind, each scan's body counted its length times:
    "dense" (dot_general without batch dims: projections and head), "attention" (with batch
    dims), and the ragged dots by their operands' shapes (how often each runs)."""
    for e in jaxpr.eqns:
        n = times * (e.params["length"] if e.primitive.name == "scan" else 1)
        a, b = (v.aval.shape for v in e.invars[:2]) if len(e.invars) > 1 else ((), ())
        if e.primitive.name == "dot_general":
            (contracted, _), (batch, _) = e.params["dimension_numbers"]
            flops = 2.0 * np.prod(e.outvars[0].aval.shape) * np.prod([a[i] for i in contracted])
            kind = "attention" if batch else "dense"
            out[kind] = out.get(kind, 0.0) + n * flops
        elif e.primitive.name.startswith("ragged_dot"):
            out[f"{a}x{b}"] = out.get(f"{a}x{b}", 0.0) + n
        for p in e.params.values():
            for q in p if isinstance(p, list | tuple) else [p]:
                if isinstance(q, jcore.ClosedJaxpr | jcore.Jaxpr):
                    _matmuls(getattr(q, "jaxpr", q), n, out)


def _counts(model: Any, remat: str) -> tuple[dict[str, float], dict[str, float], TrainSpec]:
    """The matmuls of the step's loss (forward) and of its gradient, on one CPU device."""
    train = TrainSpec(global_batch=2, remat=remat)
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    step = make_step(mesh, model, train, batch_axes="data")
    params, _, batch = step.abstract_args()
    args = [
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in t.items()} for t in (params, batch)
    ]
    fwd: dict[str, float] = {}
    grad: dict[str, float] = {}
    _matmuls(jax.make_jaxpr(step.loss)(*args).jaxpr, 1, fwd)
    _matmuls(jax.make_jaxpr(jax.value_and_grad(step.loss))(*args).jaxpr, 1, grad)
    return fwd, grad, train


@pytest.mark.parametrize("remat", ["full", "offload", "dots", "dots_attention"])
def test_the_projections_run_again_as_the_cost_model_counts(remat: str) -> None:
    fwd, grad, train = _counts(TINY, remat)
    ops = op_flops(TINY)
    tokens = 2 * TINY.seq_len
    head = 2 * TINY.vocab_size * TINY.d_model
    projections = sum(v for t, v in ops.items() if t != "attention_out")
    assert fwd["dense"] == pytest.approx(tokens * (TINY.num_layers * projections + head))
    r = roles((("data", 1),), ("data",))
    _, _, recompute = step_flops(TINY, train, r)
    attention = ops["attention_out"]  # every checkpointed layer runs the kernel again
    # forward, the input's and the weight's gradients, and the recomputed projections
    again = recompute - tokens * TINY.num_layers * attention
    assert grad["dense"] == pytest.approx(3 * fwd["dense"] + again)
    if remat in ("full", "offload"):  # all but the down projection: nothing reads its output
        assert again == pytest.approx(tokens * TINY.num_layers * (projections - ops["mlp_out"]))


def test_a_moe_layer_runs_its_experts_down_projection_again() -> None:
    # the combine's gradient for the routing weights reads the experts' outputs
    fwd, grad, _ = _counts(MOE, "full")
    down = next(k for k in fwd if k.endswith(f"(8, {MOE.moe_d_ff}, {MOE.d_model})"))
    assert grad[down] == 2 * fwd[down]  # the forward, and again in the backward pass
