"""The q, k and v weights gathered again for their input gradient (layout.regathered): the same
training, three more all-gathers a layer, counted as the cost model counts them."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.cost.parts.traffic import collectives as priced
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import regathered, roles
from loadax_mesh.workload.step import make_step

from .losses import TINY


def test_the_rule_names_the_recomputed_projections_of_gathered_weights():
    fsdp = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    assert regathered(TINY, TrainSpec(global_batch=8), fsdp) == ("query", "key", "value")
    assert regathered(TINY, TrainSpec(global_batch=8, remat="dots"), fsdp) == ()
    kept_q = TrainSpec(global_batch=8, remat={"layer_input": "offload", "query": "device"})
    assert regathered(TINY, kept_q, fsdp) == ("key", "value")
    whole = roles([("data", 8), ("fsdp", 1)], ["data", "fsdp"])  # weights never gathered
    assert regathered(TINY, TrainSpec(global_batch=8), whole) == ()
    mla = ModelSpec.from_name("deepseek-v3")
    assert regathered(mla, TrainSpec(global_batch=8), fsdp) == ()
    parallel = ModelSpec.from_name("maxtext-2023-16b")
    assert parallel.parallel_block and regathered(parallel, TrainSpec(global_batch=8), fsdp) == ()


def _step(regather: bool, train: TrainSpec):
    plan = MeshConfig.from_preset("fsdp").plan()
    mesh = plan.to_jax_mesh()
    return make_step(mesh, TINY, train, batch_axes=plan.batch_axis_names, regather=regather)


def _gathers(step) -> tuple[int, int]:
    """The compiled step's all-gathers: (ops, bytes a step with their runs)."""
    text = step.fn.lower(*step.abstract_args()).compile().as_text()
    found = [
        c for c in collectives(HloText(text), step.mesh.devices.size) if c.kind == "all-gather"
    ]
    return sum(c.count for c in found), sum(c.bytes * c.count for c in found)


@pytest.mark.slow
def test_the_compiled_step_gathers_q_k_v_again_as_the_cost_model_counts():
    """On 8 CPU devices (fsdp 8, full remat) the re-gathering step runs one more all-gather of
    each of q, k and v a layer, their bytes what `cost.traffic` prices for it (in float32:
    XLA's CPU compiler gathers the stored weight and casts after, libtpu casts first)."""
    train = TrainSpec(global_batch=8, compute_dtype="float32")
    plain, again = (_step(flag, train) for flag in (False, True))
    assert (plain.regathered, again.regathered) == ((), ("query", "key", "value"))
    (runs, moved), (runs_again, moved_again) = _gathers(plain), _gathers(again)
    extra = [
        c
        for c in priced(TINY, train, again.roles, overlapped=True, regather=True)
        if c.what == "q, k, v weights again"
    ]
    assert len(extra) == 1 and extra[0].count == TINY.num_layers
    assert runs_again - runs == 3 * TINY.num_layers
    assert moved_again - moved == extra[0].bytes * extra[0].count


@pytest.mark.slow
def test_the_regathered_step_trains_as_the_plain_one():
    """The barrier changes what XLA may reuse, not a value: float32 losses of the re-gathering
    step over fsdp 8 match the plain step's."""
    train = TrainSpec(global_batch=8, learning_rate=1e-2, compute_dtype="float32")
    rows = np.random.default_rng(0).integers(0, TINY.vocab_size, (8, TINY.seq_len + 1))
    tokens = rows.astype(np.int32)
    losses = []
    for flag in (False, True):
        step = _step(flag, train)
        params, opt = step.init(jax.random.key(0))
        batch = {
            "tokens": jax.device_put(tokens[:, :-1], step.batch_sharding),
            "targets": jax.device_put(tokens[:, 1:], step.batch_sharding),
        }
        run = []
        for _ in range(3):
            params, opt, loss = step.fn(params, opt, batch)
            run.append(float(loss))
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    assert (np.diff(losses[1]) < 0).all(), losses


@pytest.mark.slow
def test_the_projection_and_its_gradients_are_the_einsums():
    from loadax_mesh.workload.step import _regathered_projection

    keys = jax.random.split(jax.random.key(1), 3)
    h = jax.random.normal(keys[0], (2, 4, 8), dtype=jax.numpy.bfloat16)
    w = jax.random.normal(keys[1], (8, 2, 4))  # stored in float32, cast to h's dtype
    g = jax.random.normal(keys[2], (2, 4, 2, 4), dtype=jax.numpy.bfloat16)

    def plain(h, w):
        return jax.numpy.einsum("bsd,dhk->bshk", h, w.astype(h.dtype))

    want, pull = jax.vjp(plain, h, w)
    got, pull_again = jax.vjp(_regathered_projection, h, w)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    for a, b in zip(pull_again(g), pull(g), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.compile
@pytest.mark.slow
def test_the_step_regathers_as_its_platform_wants():
    """The compile-only TPU devices get the re-gathering step (the trait), CPU devices not."""
    from loadax_mesh.hardware.topology import topology_devices

    train = TrainSpec(global_batch=8)
    for devices, want in ((topology_devices("tpu-v5litepod-8"), ("query", "key", "value")),
                          (None, ())):  # fmt: skip
        plan = MeshConfig.from_preset("fsdp").plan(devices)
        step = make_step(plan.to_jax_mesh(), TINY, train, batch_axes=plan.batch_axis_names)
        assert step.regathered == want
