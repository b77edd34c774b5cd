"""The reference step's low-precision matmuls (TrainSpec.quantization "fp8" or "int8").

Each is a custom VJP, as qwix's quantized training builds them (its `dot_general_qt`; qwix
itself reaches a step only through a flax model's interception, which this plain-jax step has
none of): both operands quantized with current absmax scales, multiplied in low precision with
a wide accumulator, the scales applied to the product. fp8: float8_e4m3fn operands forward,
the gradient in float8_e5m2, float32 accumulation inside the GEMM and the product written in
the activations' dtype (as qwix writes it: the partial sums the devices reduce are then as wide
as the bfloat16 step's); int8: int8 operands and int8 gradients, int32 products. Scales are
per channel: a scale for each index of the dims that are not contracted (an activation's or
gradient's row, a weight's output channel), the absmax over the contracted ones, so the scales
factor out of the sum. The backward pass reuses the forward's quantized operands: the scale of
the operand it contracts against is first multiplied into the incoming gradient, which is then
quantized per row of its own (qwix's scale shifting). Results come out in the dtype of the
step's activations.

Expert matmuls: `grouped` for `jax.lax.ragged_dot` (TPU and CPU), the rows per row, the
weights per output channel over every expert; tokamax's GPU kernels stay in compute dtype.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

# quantization: the forward's operands, the gradient's, and the product's type (None: the
# activations' dtype; the float32 accumulator stays inside the GEMM, as qwix's fp8 product)
FORMATS: dict[str, tuple[Any, Any, Any]] = {
    "fp8": (jnp.float8_e4m3fn, jnp.float8_e5m2, None),
    "int8": (jnp.int8, jnp.int8, jnp.int32),
}


def einsum(
    spec: str, x: jax.Array, w: jax.Array, *, quantization: str, regather: bool = False
) -> jax.Array:
    """`jnp.einsum(spec, x, w)` of an activation `x` and a weight `w` (cast to x's dtype), in
    `quantization`'s precision ("none": as it is). Every letter of `spec` is contracted between
    the two operands or kept in the output. `regather`: the backward pass gathers the stored
    weight again (`remat._regathered_projection`) rather than keeping the forward's."""
    if quantization == "none":
        return jnp.einsum(spec, x, w.astype(x.dtype))
    return _einsum(spec, quantization, regather, x, w)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _einsum(spec: str, quantization: str, regather: bool, x: jax.Array, w: jax.Array) -> Any:
    return _einsum_forward(spec, quantization, regather, x, w)[0]


def _einsum_forward(
    spec: str, quantization: str, regather: bool, x: jax.Array, w: jax.Array
) -> tuple[jax.Array, Any]:
    (xl, wl), out = _letters(spec)
    forward, _, acc = FORMATS[quantization]
    acc = acc or x.dtype
    xq, sx = _quantize(x, xl, out, forward)
    wq, sw = _quantize(w.astype(x.dtype), wl, out, forward)
    y = jnp.einsum(spec, xq, wq, preferred_element_type=acc)
    y = _scaled(y, (sx, xl), (sw, wl), out).astype(x.dtype)
    kept = w if regather else wq  # regathered: the stored weight, quantized again
    return y, (xq, sx, kept, sw, jnp.zeros((), w.dtype))


def _einsum_backward(
    spec: str, quantization: str, regather: bool, res: Any, g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    (xl, wl), out = _letters(spec)
    forward, grad, acc = FORMATS[quantization]
    acc = acc or g.dtype
    xq, sx, wq, sw, w_dtype = res
    if regather:  # the barrier hides that the stored weight is the forward's: gathered again
        wq = _quantize(jax.lax.optimization_barrier(wq).astype(g.dtype), wl, out, forward)[0]
    dx = _contract(f"{out},{wl}->{xl}", g, (sw, wl), wq, grad, acc).astype(g.dtype)
    dw = _contract(f"{xl},{out}->{wl}", g, (sx, xl), xq, grad, acc, grad_first=False)
    return dx, dw.astype(w_dtype.dtype)


_einsum.defvjp(_einsum_forward, _einsum_backward)


def _contract(
    spec: str,
    g: jax.Array,
    scale: tuple[jax.Array, str],
    other: jax.Array,
    grad: Any,
    acc: Any,
    *,
    grad_first: bool = True,
) -> jax.Array:
    """One backward matmul of the gradient `g` and a forward operand kept quantized (`other`,
    its scale `scale` over its letters): the scale shifted into g, g quantized per row of the
    result, the product rescaled (float32)."""
    (first, second), result = _letters(spec)
    letters = first if grad_first else second
    shifted = g.astype(jnp.float32) * _along(scale[0], scale[1], letters)
    gq, sg = _quantize(shifted, letters, result, grad)
    operands = (gq, other) if grad_first else (other, gq)
    y = jnp.einsum(spec, *operands, preferred_element_type=acc)
    return y.astype(jnp.float32) * _along(sg, letters, result)


def grouped(rows: jax.Array, weights: jax.Array, sizes: jax.Array, quantization: str) -> jax.Array:
    """`jax.lax.ragged_dot(rows [m, k], weights [g, k, n], sizes)` in `quantization`'s
    precision: each row scaled on its own, each output channel over every expert (a scale
    constant along what each product contracts: k forward, n and the rows backward)."""
    return _grouped(quantization, rows, weights, sizes)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped(quantization: str, rows: jax.Array, weights: jax.Array, sizes: jax.Array) -> Any:
    return _grouped_forward(quantization, rows, weights, sizes)[0]


def _grouped_forward(
    quantization: str, rows: jax.Array, weights: jax.Array, sizes: jax.Array
) -> tuple[jax.Array, Any]:
    forward, _, acc = FORMATS[quantization]
    acc = acc or rows.dtype
    rq, sr = _quantize(rows, "mk", "mn", forward)
    wq, sw = _quantize(weights.astype(rows.dtype), "gkn", "n", forward)
    y = jax.lax.ragged_dot(rq, wq, sizes, preferred_element_type=acc)
    y = y.astype(jnp.float32) * sr * sw.reshape(1, -1)
    return y.astype(rows.dtype), (rq, sr, wq, sw, sizes, jnp.zeros((), weights.dtype))


def _grouped_backward(quantization: str, res: Any, g: jax.Array) -> tuple[Any, Any, None]:
    _, grad, acc = FORMATS[quantization]
    acc = acc or g.dtype
    rq, sr, wq, sw, sizes, w_dtype = res
    g32 = g.astype(jnp.float32)
    # rows' gradient [m, k]: g [m, n] against each row's expert [k, n], contracting n
    gq, sg = _quantize(g32 * sw.reshape(1, -1), "mn", "mk", grad)
    dx = _ragged(gq, wq, sizes, _ROWS_GRAD, acc).astype(jnp.float32) * sg
    # weights' gradient [g, k, n]: rows [m, k] against g [m, n], contracting each group's rows
    gq, sg = _quantize(g32 * sr, "mn", "gkn", grad)
    dw = _ragged(rq, gq, sizes, _WEIGHTS_GRAD, acc).astype(jnp.float32) * sg.reshape(1, 1, -1)
    return dx.astype(g.dtype), dw.astype(w_dtype.dtype), None


_grouped.defvjp(_grouped_forward, _grouped_backward)

# ragged_dot's two transposes (jax's own rule): g [m, n] x weights [g, k, n] -> [m, k], rows
# in groups; rows [m, k] x g [m, n] -> [g, k, n], the rows contracted group by group
_ROWS_GRAD = jax.lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), [0], [0])
_WEIGHTS_GRAD = jax.lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), [0], [])


def _ragged(a: jax.Array, b: jax.Array, sizes: jax.Array, dims: Any, acc: Any) -> jax.Array:
    return jax.lax.ragged_dot_general(a, b, sizes, dims, preferred_element_type=acc)


def _letters(spec: str) -> tuple[tuple[str, str], str]:
    inputs, out = spec.split("->")
    first, second = inputs.split(",")
    return (first, second), out


def _quantize(a: jax.Array, letters: str, keep: str, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """`a` (its dims named by `letters`) in `dtype` and its float32 scale: the absmax over the
    dims whose letters are not in `keep`, mapped to the format's largest value (dims kept
    as size 1, so that a = quantized * scale up to rounding)."""
    axes = tuple(i for i, c in enumerate(letters) if c not in keep)
    amax = jnp.max(jnp.abs(a.astype(jnp.float32)), axis=axes, keepdims=True)
    integer = jnp.issubdtype(dtype, jnp.integer)
    top = float(jnp.iinfo(dtype).max if integer else jnp.finfo(dtype).max)
    scale = jnp.where(amax > 0, amax / top, 1.0)
    q = a.astype(jnp.float32) / scale
    if integer:
        q = jnp.round(q)
    return jnp.clip(q, -top, top).astype(dtype), scale


def _along(scale: jax.Array, letters: str, target: str) -> jax.Array:
    """A scale over `letters` (size 1 where reduced) broadcastable against an array over
    `target`: its kept dims moved to where `target` has them, size 1 elsewhere."""
    kept = [c for c in letters if c in target]
    squeezed = scale.reshape([scale.shape[i] for i, c in enumerate(letters) if c in target])
    order = sorted(range(len(kept)), key=lambda i: target.index(kept[i]))
    moved = jnp.transpose(squeezed, order)
    sizes = dict(zip([kept[i] for i in order], moved.shape, strict=True))
    return moved.reshape([sizes.get(c, 1) for c in target])


def _scaled(
    y: jax.Array, x: tuple[jax.Array, str], w: tuple[jax.Array, str], out: str
) -> jax.Array:
    return y.astype(jnp.float32) * _along(x[0], x[1], out) * _along(w[0], w[1], out)
