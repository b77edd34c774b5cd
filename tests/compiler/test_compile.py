"""The reference step compiled by libtpu's TPU compiler: the report, FLOPs, axes, refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from loadax_mesh import MeshConfig, MeshConfigError
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.replica_groups import group_axes
from loadax_mesh.compiler.report import compile_step, step_flops
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes, roles

TINY = ModelSpec.from_name("tiny")


@pytest.fixture(scope="module")
def fsdp_tp():
    plan = MeshConfig.from_preset("fsdp_tp").plan(topology_devices("tpu-v5litepod-8"))
    return plan, compile_step(plan, TINY, TrainSpec(global_batch=8))


@pytest.mark.compile
@pytest.mark.slow
def test_the_report(fsdp_tp):
    plan, report = fsdp_tp
    assert report.mesh == {"data": 1, "fsdp": 2, "model": 4} and report.attention == "splash"
    parts = (report.argument_bytes, report.output_bytes, report.temp_bytes, report.alias_bytes)
    assert report.total_bytes == parts[0] + parts[1] + parts[2] - parts[3] > 0
    assert report.hbm_bytes == int(15.75 * 2**30) and report.fits is True
    # libtpu's own buffer assignment: the arguments plus its temp block, below the sum
    assert parts[0] < report.assigned_bytes <= report.total_bytes
    # Arguments: parameters and two Adam moments (float32, sharded by the layout) and a batch.
    r = roles(tuple(plan.shape.items()), plan.batch_axis_names)
    params = sum(np.prod(s) * 4 // r.shards(axes) for s, axes in param_shapes(TINY).values())
    tokens = 2 * 8 * TINY.seq_len * 4 // r.size("batch")
    # (TPU pads every array's two minor dims to whole (8, 128) tiles: a tiny model pays for it)
    assert 3 * params + tokens <= report.argument_bytes <= 1.5 * (3 * params + tokens)
    assert report.alias_bytes >= 3 * params * 0.99  # params and moments are donated
    # Parameter all-gathers over fsdp; over model the residual stream's hidden dim is cut, so
    # each norm's output is gathered whole (rows x seq x d_model) for its matmuls.
    kinds = {(c.kind, c.axes) for c in report.collectives}
    assert ("all-gather", ("fsdp",)) in kinds
    whole = 8 // r.size("batch") * TINY.seq_len * TINY.d_model * 2
    assert any(c.kind == "all-gather" and c.axes == ("model",) and c.bytes == whole
               for c in report.collectives)  # fmt: skip
    assert all(c.count >= 1 and c.bytes > 0 for c in report.collectives)
    assert report.flops is not None and report.flops > 6 * TINY.num_params * 8 * 128 / 8


@pytest.mark.compile
@pytest.mark.slow
def test_loop_bodies_count_once_per_trip():
    """FLOPs of a scanned stack equal the compiler's own count for the same stack unrolled."""
    config = MeshConfig((4,), ("fsdp",), batch_axis_names="fsdp")
    mesh = config.create_device_mesh(topology_devices("tpu-v5litepod-4"))
    layers, width = 8, 512
    x = jax.ShapeDtypeStruct((256, width), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
    ws = jax.ShapeDtypeStruct(
        (layers, width, width), jnp.float32, sharding=NamedSharding(mesh, P())
    )

    def scanned(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()

    def unrolled(x, ws):
        for i in range(layers):
            x = jnp.tanh(x @ ws[i])
        return x.sum()

    loop = jax.jit(scanned).lower(x, ws).compile()
    flat = jax.jit(unrolled).lower(x, ws).compile()
    once = loop.cost_analysis()["flops"]
    counted = step_flops(loop, HloText(loop.as_text()))
    assert counted == pytest.approx(flat.cost_analysis()["flops"], rel=0.02)
    assert counted > 6 * once  # the compiler's own figure counted the body once


@pytest.mark.compile
@pytest.mark.slow
def test_groups_map_to_mesh_axes_in_mesh_order():
    """A psum over one axis of a mesh whose devices are not in id order spans exactly it."""
    devices = np.array(topology_devices("tpu-v5litepod-8"))[::-1].reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("a", "b"))
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("a", "b"))))
    for axis in ("a", "b"):
        summed = jax.shard_map(
            lambda v, axis=axis: jax.lax.psum(v, axis),
            mesh=mesh,
            in_specs=P(("a", "b")),
            out_specs=P(("a", "b")),
            check_vma=False,
        )
        hlo = HloText(jax.jit(summed).lower(x).compile().as_text())
        found = [c for c in collectives(hlo, 8) if c.kind == "all-reduce"]
        assert found and all(group_axes(c.groups, {"a": 2, "b": 4}) == (axis,) for c in found)


@pytest.mark.compile
@pytest.mark.slow
def test_a_step_that_does_not_fit_is_a_report_of_the_step_as_written():
    """Out of HBM, libtpu rematerialises beyond the step's policy before it refuses; the
    report's figure is the step as written, larger than the squeezed one."""
    deep = ModelSpec(
        name="deep",
        num_layers=4,
        d_model=4096,
        d_ff=14336,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=32000,
        seq_len=2048,
    )
    plan = MeshConfig((1,), ("data",)).plan(topology_devices("tpu-v5litepod-1"))
    report = compile_step(plan, deep, TrainSpec(global_batch=16))
    assert report.fits is False and "exceeds available HBM" in (report.message or "")
    assert report.hbm_bytes == int(15.75 * 2**30) < report.squeezed_bytes < report.total_bytes
    assert report.total_bytes > 16 * deep.num_params  # weights, gradients, two moments


@pytest.mark.compile
@pytest.mark.slow
def test_multislice_data_axis_crosses_slices():
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices("tpu-v5litepod-8-2"))
    assert plan.dcn_mesh_shape == (2, 1)
    report = compile_step(plan, TINY, TrainSpec(global_batch=16))
    assert any(c.axes == ("data",) for c in report.collectives)


def test_model_axis_must_divide_heads():
    """Refused before any compile: the rule is the layout's, the same on any platform (this
    process's eight CPU devices; the quick lane starts no TPU client)."""
    plan = MeshConfig((1, 8), ("data", "model")).plan()
    odd = ModelSpec(
        **{**vars(TINY), "name": "odd", "num_heads": 4, "num_kv_heads": 4, "head_dim": 32}
    )
    with pytest.raises(MeshConfigError, match="num_heads=4 does not divide over the model axis"):
        compile_step(plan, odd, TrainSpec(global_batch=8))
