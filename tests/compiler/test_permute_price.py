"""The TPU compiler prices a row gather and jax's scatter-add transpose alike.

cost/timing/moe.py moves the dropless path's rows at one rate, `permute_bandwidth`, whether a
pass gathers them (the forward's sort and unsort; MaxText's custom sort VJP backward) or
scatter-adds them (the transpose of `jnp.take`). These tests hold libtpu to what made one
rate the model (benchmarks/probes/probe_permute.py, docs/notes/2026-11-26-dropless-permutes.md):
the scatter-add compiles as a sort of its indices, a gather and a sorted scatter, and XLA's
roofline (`optimal_seconds`) prices it within 30% of the gather, as it prices the custom VJP's
argsort and gather. (At
8192 rows of 1024 or 4096 its roofline prices the scatter-add 4 to 11 times below the gather,
at 4096 with the updates' gather fused into the scatter: the referee holds at the runs'
widths.)
"""

from __future__ import annotations

import functools

import pytest

from loadax_mesh.hardware.topology import topology_devices

ROWS, WIDTH = 8192, 5120  # a width of the dropless runs (Llama 4's d_model)


def _compiled(fn, *args):
    import jax
    from jax.sharding import SingleDeviceSharding

    device = next(iter(topology_devices("tpu-v5p-8")))
    sharding = SingleDeviceSharding(device)
    compiled = jax.jit(fn, in_shardings=tuple(sharding for _ in args)).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["optimal_seconds"]), compiled.as_text()


@functools.cache
def _ops():
    import jax
    import jax.numpy as jnp

    rows = jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.bfloat16)
    index = jax.ShapeDtypeStruct((ROWS,), jnp.int32)

    def gather(x, i):
        return jnp.take(x, i, axis=0)

    def scatter_add(g, i):
        _, transpose = jax.vjp(lambda x: gather(x, i), jnp.zeros(rows.shape, rows.dtype))
        return transpose(g)[0]

    def custom_vjp_backward(g, order):
        return jnp.take(g, jnp.argsort(order), axis=0)

    return {
        name: _compiled(fn, rows, index)
        for name, fn in (
            ("gather", gather),
            ("scatter-add", scatter_add),
            ("custom", custom_vjp_backward),
        )
    }


@pytest.mark.compile
@pytest.mark.slow
def test_scatter_add_compiles_as_sort_gather_and_sorted_scatter() -> None:
    _, text = _ops()["scatter-add"]
    assert ") sort(" in text
    assert "} gather(" in text
    assert "} scatter(" in text and "indices_are_sorted=true" in text


@pytest.mark.compile
@pytest.mark.slow
def test_gather_and_scatter_add_priced_within_30_percent() -> None:
    found = _ops()
    gather = found["gather"][0]
    assert gather > 0
    for name in ("scatter-add", "custom"):
        assert 0.7 <= found[name][0] / gather <= 1.3, (name, found[name][0], gather)
