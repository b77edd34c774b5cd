"""A parallel block (`ModelSpec.parallel_block`): attention and the MLP off one norm, summed."""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes
from loadax_mesh.workload.step import make_step

from .losses import sharded_and_single_losses

# MaxText's 2023 layer in miniature: multi-head attention, a ReLU MLP, tied embeddings.
PARALLEL = replace(
    ModelSpec.from_name("tiny"),
    name="tiny-parallel",
    num_layers=2,
    num_kv_heads=8,
    head_dim=32,
    tied_embeddings=True,
    mlp="relu",
    parallel_block=True,
)


def _rms(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * scale


def _rotate(x: np.ndarray) -> np.ndarray:
    """Rotary positions on [batch, seq, heads, head_dim]: the halves rotated by angle
    position * 10000 ** (-i / half)."""
    seq, half = x.shape[1], x.shape[-1] // 2
    angle = np.arange(seq)[:, None] * 10000.0 ** (-np.arange(half) / half)
    s, c = np.sin(angle)[None, :, None], np.cos(angle)[None, :, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def parallel_loss(p: dict[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray) -> float:
    """The parallel block written out: x + attention(norm(x)) + mlp(norm(x)) with ONE norm per
    layer, then the final norm, tied logits and the mean cross-entropy."""
    x = p["embed"][tokens]
    seq = tokens.shape[1]
    causal = np.tril(np.ones((seq, seq), bool))
    for i in range(PARALLEL.num_layers):
        h = _rms(x, p["layers/attn_norm"][i])
        q, k, v = (np.einsum("bsd,dhk->bshk", h, p[f"layers/{w}"][i]) for w in ("wq", "wk", "wv"))
        q, k = _rotate(q), _rotate(k)
        scores = np.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(PARALLEL.head_dim)
        scores = np.where(causal, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        attn = np.einsum("bhqs,bshk,hkd->bqd", weights, v, p["layers/wo"][i])
        mlp = np.maximum(h @ p["layers/w_up"][i], 0) @ p["layers/w_down"][i]
        x = x + attn + mlp
    logits = _rms(x, p["final_norm"]) @ p["embed"].T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def test_one_norm_a_layer_in_the_counts_and_the_parameters():
    names = set(param_shapes(PARALLEL))
    assert "layers/attn_norm" in names and "layers/mlp_norm" not in names
    sequential = replace(PARALLEL, parallel_block=False)
    assert PARALLEL.norms == 1 and sequential.norms == 2
    assert sequential.num_params - PARALLEL.num_params == PARALLEL.num_layers * PARALLEL.d_model
    assert sum(math.prod(s) for s, _ in param_shapes(PARALLEL).values()) == PARALLEL.num_params


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parallel_block": 1}, "parallel_block=1; accepted: true or false"),
        ({"parallel_block": "yes"}, "parallel_block='yes'; accepted: true or false"),
    ],
)
def test_bad_parallel_block(change, message):
    with pytest.raises(MeshConfigError, match=message):
        replace(PARALLEL, **change)


def test_a_parallel_block_with_experts_is_refused_by_the_step():
    moe = replace(
        PARALLEL, mlp="swiglu", num_experts=4, experts_per_token=2, moe_d_ff=32, name="moe-par"
    )
    with pytest.raises(MeshConfigError, match="parallel_block=True with num_experts=4"):
        param_shapes(moe)


@pytest.mark.slow
def test_the_loss_is_the_parallel_block_written_out():
    plan = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    train = TrainSpec(global_batch=2, compute_dtype="float32", attention="plain")
    step = make_step(plan.to_jax_mesh(), PARALLEL, train, batch_axes=plan.batch_axis_names)
    params, _ = step.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    # norm scales away from 1, so that a second norm (or none) would show
    params = {
        k: v * rng.uniform(0.5, 1.5, v.shape).astype(np.float32) if k.endswith("norm") else v
        for k, v in params.items()
    }
    tokens = rng.integers(0, PARALLEL.vocab_size, (2, PARALLEL.seq_len + 1)).astype(np.int32)
    batch = {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}
    got = float(jax.jit(step.loss)(params, batch))
    numpy_params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    want = parallel_loss(numpy_params, batch["tokens"], batch["targets"])
    assert got == pytest.approx(want, rel=2e-4)
    sequential = replace(PARALLEL, parallel_block=False)
    assert want != pytest.approx(
        float(
            jax.jit(make_step(plan.to_jax_mesh(), sequential, train, batch_axes=("data",)).loss)(
                {**params, "layers/mlp_norm": params["layers/attn_norm"]}, batch
            )
        ),
        rel=1e-3,
    )


@pytest.mark.slow
def test_the_parallel_block_trains_sharded_as_on_one_device():
    """Over fsdp x tensor (the norm's output gathered once for both halves, their sum reduced)
    the losses are one device's, and they fall."""
    train = TrainSpec(global_batch=8, learning_rate=1e-2, compute_dtype="float32")
    sharded, single_device = sharded_and_single_losses(PARALLEL, train)
    np.testing.assert_allclose(sharded, single_device, rtol=1e-5)
    assert (np.diff(sharded) < 0).all(), sharded
