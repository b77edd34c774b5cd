"""The step's fsdp weight gathers compile as all-gathers, not all-reduces of padded buffers.

libtpu turns an all-gather over a whole v5p torus (4x4x4 and up) into a dynamic-update-slice
into zeros and an all-reduce unless its devices carry the slice's wraparound and run in the
grid's raster order (benchmarks/probes/probe_gathers.py,
docs/notes/2026-11-26-fsdp-gathers-as-all-reduces.md); the step itself emits
all-gathers, which these tests hold it to.
"""

from __future__ import annotations

import numpy as np
import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.strings import parse_hardware
from loadax_mesh.hardware.topology import topology_devices, tpu_topology_args
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes
from loadax_mesh.workload.step import make_step

TINY = ModelSpec.from_name("tiny")


def layer_weight_bytes(model: ModelSpec) -> int:
    """One layer's matrices in bf16 (the norms, never gathered, left out)."""
    return sum(
        int(np.prod(shape[1:])) * 2
        for name, (shape, _) in param_shapes(model).items()
        if name.startswith("layers/") and not name.endswith("norm")
    )


def gathered_bytes(items) -> int:
    """Bytes a step all-gathers (each op's whole output times its runs)."""
    return sum(kind_bytes * count for kind, kind_bytes, count in items if kind == "all-gather")


@pytest.mark.compile
@pytest.mark.slow
def test_the_layer_weights_are_all_gathered_over_fsdp():
    hw = "tpu-v5p-32"  # fsdp 16 over 2x2x4: no wraparound, libtpu keeps every all-gather
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hw), selector=hw)
    report = compile_step(plan, TINY, TrainSpec(global_batch=16))
    items = [(c.kind, c.bytes, c.count) for c in report.collectives if c.axes == ("fsdp",)]
    # every layer's matrices gathered at least once a layer (forward; remat gathers again)
    assert gathered_bytes(items) >= TINY.num_layers * layer_weight_bytes(TINY)


@pytest.mark.compile
@pytest.mark.slow
def test_on_a_whole_torus_the_gathers_need_wraparound_and_raster_order():
    from jax.experimental import mesh_utils, topologies
    from jax.sharding import Mesh

    hw = "tpu-v5p-128"  # fsdp 64 over the whole 4x4x4 torus
    spec = parse_hardware(hw)
    assert spec.wrap == (True, True, True)
    name, kwargs = tpu_topology_args(spec)
    devices = list(topologies.get_topology_desc(name, "tpu", wrap=spec.wrap, **kwargs).devices)
    model = TINY
    train = TrainSpec(global_batch=64)

    def gathered(grid) -> int:
        mesh = Mesh(grid, ("data", "fsdp"))
        step = make_step(mesh, model, train, batch_axes=("data", "fsdp"))
        text = step.fn.lower(*step.abstract_args()).compile().as_text()
        ids = [d.id for d in mesh.devices.flat]
        return gathered_bytes(
            [(c.kind, c.bytes, c.count) for c in collectives(HloText(text), 64, ids)]
        )

    raster = mesh_utils.create_device_mesh((1, 64), devices)
    assert gathered(raster) >= model.num_layers * layer_weight_bytes(model)
    # the plan's host-contiguous ring order: libtpu gathers by all-reduce instead
    # (docs/notes/2026-11-26-fsdp-gathers-as-all-reduces.md); this flips when the solver
    # orders a whole-torus axis as the raster does
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hw), selector=hw)
    by = {(tuple(d.coords), d.core_on_chip): d for d in devices}
    order = [by[(tuple(d.coords), d.core_on_chip)] for d in plan.to_jax_mesh().devices.flat]
    assert gathered(np.array(order).reshape(1, 64)) == 0
