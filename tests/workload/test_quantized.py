"""Low-precision matmuls in the reference step (TrainSpec.quantization, workload/quantized.py):
each matmul and its gradients against float32 within its format's precision, the step's jaxpr
(which matmuls run in fp8 or int8, which stay in compute dtype), the saved tensors under
remat, and the losses on 8 CPU devices against the bfloat16 step's.

Tolerances, from the formats: rounding to a format with p mantissa bits moves a value by at
most u = 2^-(p+1) of itself (e4m3: p = 3, u = 2^-4; e5m2: p = 2, u = 2^-3), uniformly, so by
u / sqrt(3) rms; a product of two rounded operands, its errors independent over the
contracted sum, by about sqrt(2/3) u in norm (e4m3 x e4m3: 5.1%; e5m2 x e4m3 in the
gradients: 8.1%). Int8 rounds to a step of 1/127 of each row's absmax: half a step at most,
absmax / 440 rms, about 0.6% of the rms of a Gaussian row of 64 (absmax about 2.4 sigma), 0.8%
for the product. The bounds below are u for fp8's forward (2^-4), e5m2's u for its gradients
(2^-3), and 2^-6 for int8: about twice what the formats give, never loose enough to pass a
wrong scale (tens of percent)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.sharding import Mesh

from loadax_mesh import MeshConfig
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload import quantized as q
from loadax_mesh.workload.step import make_step

from .losses import TINY, train_losses
from .test_moe import MOE

FORWARD = {"fp8": 2.0**-4, "int8": 2.0**-6}
GRADIENT = {"fp8": 2.0**-3, "int8": 2.0**-6}


def _relative(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("quantization", ["fp8", "int8"])
@pytest.mark.parametrize(
    ("spec", "x_shape", "w_shape", "regather"),
    [
        ("bsd,dhk->bshk", (2, 16, 64), (64, 4, 16), False),  # a query projection
        ("bsd,dhk->bshk", (2, 16, 64), (64, 4, 16), True),  # its weight gathered again
        ("bshk,hkd->bsd", (2, 16, 4, 16), (4, 16, 64), False),  # the output projection
        ("ecd,edf->ecf", (4, 8, 64), (4, 64, 32), False),  # experts batched (capacity)
    ],
)
def test_a_matmul_and_its_gradients_within_the_formats_precision(
    quantization, spec, x_shape, w_shape, regather
):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal(w_shape) * 0.1, jnp.float32)
    exact, exact_vjp = jax.vjp(lambda x, w: jnp.einsum(spec, x.astype(jnp.float32), w), x, w)
    g = jnp.asarray(rng.standard_normal(exact.shape), jnp.float32)

    def low(x: jax.Array, w: jax.Array) -> jax.Array:
        return q.einsum(spec, x, w, quantization=quantization, regather=regather)

    y, vjp = jax.vjp(low, x, w)
    dx, dw = vjp(g.astype(jnp.bfloat16))
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    ex, ew = exact_vjp(g)
    assert _relative(y, exact) < FORWARD[quantization]
    assert _relative(dx, ex) < GRADIENT[quantization]
    assert _relative(dw, ew) < GRADIENT[quantization]
    if regather:  # the weight quantized again in the backward pass: the same gradients
        again = jax.vjp(lambda x, w: q.einsum(spec, x, w, quantization=quantization), x, w)
        np.testing.assert_array_equal(again[1](g.astype(jnp.bfloat16))[1], dw)


@pytest.mark.parametrize("quantization", ["fp8", "int8"])
def test_grouped_matmul_and_its_gradients_within_the_formats_precision(quantization):
    """Rows in groups of 10, 0, 30 and 20 (4 rows past the groups, which ragged_dot leaves
    zero and whose gradients are zero), against jax's ragged_dot in float32."""
    rng = np.random.default_rng(1)
    rows = jnp.asarray(rng.standard_normal((64, 32)), jnp.bfloat16)
    weights = jnp.asarray(rng.standard_normal((4, 32, 48)) * 0.1, jnp.float32)
    sizes = jnp.array([10, 0, 30, 20], jnp.int32)

    def exact_fn(r: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(r.astype(jnp.float32), w, sizes)

    exact, exact_vjp = jax.vjp(exact_fn, rows, weights)
    g = jnp.asarray(rng.standard_normal(exact.shape), jnp.float32)
    y, vjp = jax.vjp(lambda r, w: q.grouped(r, w, sizes, quantization), rows, weights)
    dx, dw = vjp(g.astype(jnp.bfloat16))
    ex, ew = exact_vjp(g)
    assert not np.asarray(y[60:]).any() and not np.asarray(dx[60:]).any()
    assert _relative(y[:60], exact[:60]) < FORWARD[quantization]
    assert _relative(dx[:60], ex[:60]) < GRADIENT[quantization]
    assert _relative(dw, ew) < GRADIENT[quantization]
    assert not np.asarray(dw[1]).any()  # the empty group's weights get no gradient


def _matmuls(jaxpr: Any, times: int, out: Counter[tuple[str, ...]]) -> None:
    """FLOPs of the jaxpr's matmuls by their operands' dtypes (dense dots without batch dims
    "dense", with them "batched"; ragged dots by their rows' count), scans' bodies counted
    their length times."""
    for e in jaxpr.eqns:
        n = times * (e.params["length"] if e.primitive.name == "scan" else 1)
        if e.primitive.name in ("dot_general", "ragged_dot_general"):
            a, b = (v.aval for v in e.invars[:2])
            kind = "ragged" if e.primitive.name != "dot_general" else "dense"
            if kind == "dense":
                (contracted, _), (batch, _) = e.params["dimension_numbers"]
                kind = "batched" if batch else kind
            else:
                (contracted, _), _ = e.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
            flops = (
                2.0 * np.prod(e.outvars[0].aval.shape) * np.prod([a.shape[i] for i in contracted])
            )
            if kind == "ragged" and len(e.outvars[0].aval.shape) == 3:  # the weights' gradient
                flops /= e.outvars[0].aval.shape[0]  # each row meets one group
            out[(kind, str(a.dtype), str(b.dtype))] += n * flops
        for p in e.params.values():
            for sub in p if isinstance(p, list | tuple) else [p]:
                if isinstance(sub, jcore.ClosedJaxpr | jcore.Jaxpr):
                    _matmuls(getattr(sub, "jaxpr", sub), n, out)


def _gradient_matmuls(model: Any, **spec: Any) -> Counter[tuple[str, ...]]:
    train = TrainSpec(global_batch=2, **spec)
    step = make_step(Mesh(np.array(jax.devices()[:1]), ("data",)), model, train, batch_axes="data")
    params, _, batch = step.abstract_args()
    args = [
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in t.items()} for t in (params, batch)
    ]
    out: Counter[tuple[str, ...]] = Counter()
    _matmuls(jax.make_jaxpr(jax.value_and_grad(step.loss))(*args).jaxpr, 1, out)
    return out


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_every_projection_and_mlp_matmul_runs_low_and_attention_and_the_head_do_not(remat):
    """The fp8 step's gradient: e4m3 x e4m3 forward (the recompute too), e5m2 gradients
    against e4m3 operands in the backward pass, as many FLOPs as the bfloat16 step's
    projections and MLP; attention (batched dots) and the head (unembedding) in bfloat16,
    as in the bfloat16 step. The int8 step: int8 x int8 throughout."""
    plain = _gradient_matmuls(TINY, remat=remat)
    head = 3 * 2 * 2 * TINY.seq_len * TINY.d_model * TINY.vocab_size  # forward and 2 gradients
    bf16 = ("dense", "bfloat16", "bfloat16")
    attention = {k: v for k, v in plain.items() if k[0] == "batched"}
    assert set(plain) == {bf16, *attention}
    e4, e5 = "float8_e4m3fn", "float8_e5m2"
    fp8 = _gradient_matmuls(TINY, remat=remat, quantization="fp8")
    assert fp8[bf16] == head and {k: v for k, v in fp8.items() if k[0] == "batched"} == attention
    backward = fp8["dense", e5, e4] + fp8["dense", e4, e5]
    assert fp8["dense", e4, e4] + backward == plain[bf16] - head
    # the forward, and under "full" its recompute (all but the down projection)
    forward = fp8["dense", e4, e4]
    assert backward == 2 * forward if remat == "dots" else backward < 2 * forward
    int8 = _gradient_matmuls(TINY, remat=remat, quantization="int8")
    assert int8["dense", "int8", "int8"] == plain[bf16] - head and int8[bf16] == head
    assert {k: v for k, v in int8.items() if k[0] == "batched"} == attention


@pytest.mark.parametrize("moe", ["dropless", "capacity"])
def test_the_experts_run_low_on_cpu_and_tpu(moe):
    """A MoE model's int8 step: the routed experts (ragged dots, dropless; batched dots,
    capacity) in int8 like the projections; only the router (float32) and attention and the
    head stay wider."""
    plain = _gradient_matmuls(MOE, moe=moe)
    int8 = _gradient_matmuls(MOE, moe=moe, quantization="int8")
    kind = "ragged" if moe == "dropless" else "batched"
    bf16 = (kind, "bfloat16", "bfloat16")
    assert int8[kind, "int8", "int8"] + int8[bf16] == plain[bf16]
    # the experts' three matmuls, forward, again (the combine reads their output) and twice
    # backward, in both MoE layers: 2 x rows x d_model x moe_d_ff FLOPs each, where the rows
    # are the routed copies (dropless) or the experts' slots (capacity: 8 x 80)
    copies = 2 * MOE.seq_len * MOE.experts_per_token
    rows = copies if moe == "dropless" else 8 * int(np.ceil(copies / 8 * 1.25))
    experts = 2 * 4 * 3 * 2 * rows * MOE.d_model * MOE.moe_d_ff
    assert int8[kind, "int8", "int8"] == experts
    assert int8["dense", "float32", "float32"] == plain["dense", "float32", "float32"] > 0  # router


@pytest.mark.parametrize("quantization", ["fp8", "int8"])
def test_dots_saves_the_named_matmul_outputs_not_the_unscaled_products(quantization):
    """Under remat "dots" a quantized step saves what the bfloat16 step saves (the q, k, v,
    output projection and MLP inputs, in bfloat16), not the products' float32 or int32."""
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))

    def saved(quantization: str) -> list[tuple[str, tuple[int, ...]]]:
        train = TrainSpec(global_batch=2, remat="dots", quantization=quantization)
        step = make_step(mesh, TINY, train, batch_axes="data")
        params, _, _ = step.abstract_args()
        layer = step._checkpointed(step.spec(("batch", "seq", "hidden")))
        x = jax.ShapeDtypeStruct((2, TINY.seq_len, TINY.d_model), jnp.bfloat16)
        weights = {
            k.split("/", 1)[1]: jax.ShapeDtypeStruct(v.shape[1:], v.dtype)
            for k, v in params.items()
            if k.startswith("layers/")
        }
        from jax._src.ad_checkpoint import saved_residuals

        res = saved_residuals(lambda x, p: layer(x, p)[0].astype(jnp.float32).sum(), x, weights)
        return sorted((str(a.dtype), a.shape) for a, why in res if "argument" not in why)

    plain, low = saved("none"), saved(quantization)
    assert low == plain and {dtype for dtype, _ in low} == {"bfloat16"}


@pytest.fixture(scope="module")
def bf16_losses() -> dict[tuple[str, tuple[int, ...]], np.ndarray]:
    return {}


MESHES = [((8,), ("fsdp",)), ((2, 4), ("fsdp", "model"))]


@pytest.mark.parametrize("quantization", ["fp8", "int8"])
@pytest.mark.parametrize(("shape", "names"), MESHES, ids=["fsdp", "fsdp_tensor"])
@pytest.mark.parametrize("model", [TINY, MOE], ids=lambda m: m.name)
def test_losses_stay_near_the_bfloat16_losses_and_fall(
    bf16_losses, quantization, shape, names, model
):
    """Four steps on 8 CPU devices, dense and MoE, fsdp and fsdp x tensor. The first loss
    (the same parameters: the forward pass alone) within 2^-7 of the bfloat16 step's: the
    cross-entropy averages each matmul's error (u above) over 1024 tokens, near uniform
    predictions, where it is flat in the logits. The later ones (Adam's updates carry the
    differences along) within fp8's u, 2^-4, for both formats; and they fall."""
    plan = MeshConfig(shape, names, batch_axis_names=("fsdp",)).plan()
    key = (model.name, shape)
    if key not in bf16_losses:
        bf16_losses[key] = train_losses(plan, batch_axes=("fsdp",), model=model)
    plain = bf16_losses[key]
    low = train_losses(plan, batch_axes=("fsdp",), model=model, quantization=quantization)
    assert abs(low[0] / plain[0] - 1) < 2**-7
    np.testing.assert_allclose(low, plain, rtol=2**-4)
    assert np.all(np.diff(low) < 0) and low[-1] < 0.6 * low[0]
