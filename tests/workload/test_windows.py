"""Sliding-window attention in the reference step (docs/design.md section 14): local layers see
the last `sliding_window` tokens, global ones the whole causal prefix; the layers run as scans
of alike layers (cycle.py); 8 CPU devices train a windowed model to one device's losses, on
the fused and the plain path; a pipeline over layers of mixed windows is refused by name."""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.attention import attention
from loadax_mesh.workload.cycle import _cycle, _runs, layer_kinds
from loadax_mesh.workload.layout import roles
from loadax_mesh.workload.step import make_step

from .losses import TINY, train_losses
from .test_moe import MIXED

# Two layers: a local one (window 16 of the 128 tokens), then a global one (Gemma 2's form).
LOCAL_GLOBAL = replace(TINY, name="tiny-window", sliding_window=16, global_every=2)
# Seven layers, every third global: two groups of (local, local, global), one local left over.
CYCLE = replace(LOCAL_GLOBAL, name="tiny-cycle", num_layers=7, global_every=3)


def test_each_layer_is_local_or_global_as_the_model_says():
    assert [w for _, w in layer_kinds(CYCLE)] == [16, 16, 0, 16, 16, 0, 16]
    assert [w for _, w in layer_kinds(replace(CYCLE, global_every=0))] == [16] * 7
    assert [w for _, w in layer_kinds(TINY)] == [0, 0]


def test_the_layers_run_as_a_cycle_of_alike_runs():
    """A period of the window pattern is one group of the scan over groups; MoE and window
    periods together repeat at their lcm."""
    assert _cycle(CYCLE) == (0, 3)
    kinds = layer_kinds(CYCLE)
    assert [(r.window, r.start, r.count) for r in _runs(kinds, 0, 3)] == [(16, 0, 2), (0, 2, 1)]
    assert [(r.window, r.count) for r in _runs(kinds, 6, 7)] == [(16, 1)]
    # MoE layers 2, 4, 6, ... (moe_every 2 after one dense layer), every 3rd layer global:
    # period 6 from layer 1
    mixed = replace(MIXED, num_layers=13, sliding_window=16, global_every=3)
    assert _cycle(mixed) == (1, 6)
    got = [(r.stack, r.window, r.start) for r in _runs(layer_kinds(mixed), 1, 7)]
    assert got == [
        ("layers", 16, 1),
        ("moe_layers", 0, 0),
        ("layers", 16, 2),
        ("moe_layers", 16, 1),
        ("layers", 0, 3),
        ("moe_layers", 16, 2),
    ]


@pytest.mark.parametrize("kind", ["flash", "plain"])
def test_a_local_layer_sees_its_window_only(kind):
    """Against attention written out: query i over keys i - 15 .. i."""
    mesh = MeshConfig((1,), ("data",)).plan(jax.devices()[:1]).to_jax_mesh()
    r = roles(tuple(mesh.shape.items()), ("data",))
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 64, 4, 8)) for i in range(3))
    got = attention(q, k, v, kind=kind, mesh=mesh, roles=r, window=16)
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    seen = (j <= i) & (j > i - 16)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    weights = jax.nn.softmax(np.where(seen, scores, -np.inf), axis=-1)
    np.testing.assert_allclose(got, np.einsum("bhqk,bkhd->bqhd", weights, v), atol=1e-5)
    whole = attention(q, k, v, kind=kind, mesh=mesh, roles=r)
    assert np.abs(np.asarray(whole[:, 16:]) - np.asarray(got[:, 16:])).max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("model", [LOCAL_GLOBAL, CYCLE], ids=["local-global", "cycle"])
@pytest.mark.parametrize("kind", ["flash", "plain"])
def test_a_windowed_model_trains_like_one_device(model, kind):
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    sharded = MeshConfig.from_preset("fsdp_tp").plan()

    def run(p, m):
        return train_losses(
            p, batch_axes=p.batch_axis_names, model=m, compute_dtype="float32", attention=kind
        )

    got, want = run(sharded, model), run(single, model)
    # Measured: float32 spread against one device below 2e-6 over four steps.
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (np.diff(got) < 0).all(), got
    # the window is applied: the model without it trains to other losses
    unwindowed = run(single, replace(model, sliding_window=0, global_every=0))
    assert np.abs(unwindowed - want).max() > 1e-3


@pytest.mark.slow
def test_a_pipeline_of_local_layers_trains_like_one_device():
    """Every layer local (global_every 0): the stages run one window."""
    model = replace(TINY, num_layers=4, sliding_window=16)
    pipelined = MeshConfig((2, 4), ("pipeline", "fsdp"), batch_axis_names=("fsdp",)).plan()
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    got, want = (
        train_losses(p, batch_axes=p.batch_axis_names, model=model, compute_dtype="float32")
        for p in (pipelined, single)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_pipeline_over_layers_of_mixed_windows_is_refused():
    mesh = MeshConfig((2, 4), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    model = replace(TINY, num_layers=4, sliding_window=16, global_every=2)
    with pytest.raises(
        MeshConfigError,
        match=r"pipeline_layers=0: model 'tiny'.s last 4 layers "
        r"mix local layers \(sliding_window=16\) and global ones \(global_every=2"
        r"\).*up to 1\)",
    ):
        make_step(mesh.create_device_mesh(), model, TrainSpec(global_batch=8), batch_axes="fsdp")
