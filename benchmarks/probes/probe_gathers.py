"""Why libtpu runs the step's fsdp weight gathers as all-reduces on whole v5p tori.

Compiles the reference step (a small LLaMA-like model, fsdp over every chip) three ways and
prints, per way, the collectives of the optimised HLO by kind (ops, times a step runs them,
bytes a step per device):

1. `plan`: the plan's devices as `topology_devices` makes them (no wraparound given to libtpu)
   in the plan's device order (a host-contiguous ring);
2. `plan+wrap`: the same order, on devices made with the slice's wraparound (the catalogue's
   `HardwareSpec.wrap`, as MaxText passes `wrap=` to `get_topology_desc`);
3. `raster+wrap`: devices with wraparound, in jax's `mesh_utils.create_device_mesh` order (the
   physical grid raveled, MaxText's order for a one-axis mesh).

What it showed (docs/notes/2026-11-26-fsdp-gathers-as-all-reduces.md): on a full torus
(tpu-v5p-128, 4x4x4) libtpu's `TpuAllGatherDecomposer` (pass `all_gather_decomposer`, before
layout assignment) turns every all-gather the SPMD partitioner emitted into a
dynamic-update-slice into zeros and an all-reduce in ways 1 and 2; only way 3 keeps them as
all-gathers. On tpu-v5p-64 (2x4x4, no wraparound) all three keep the all-gathers. One TPU
compile at a time; each takes seconds here.

    python benchmarks/probes/probe_gathers.py [HARDWARE] [--d-model 128] [--batch N]
        (one TPU slice)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import defaultdict
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from loadax_mesh import MeshConfig, topology_devices
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.hardware.strings import parse_hardware
from loadax_mesh.hardware.topology import tpu_topology_args
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step


def wrapped_devices(hardware: str) -> list[Any]:
    """The slice's compile-only devices, made with its wraparound (as MaxText makes them)."""
    from jax.experimental import topologies

    spec = parse_hardware(hardware)
    name, kwargs = tpu_topology_args(spec)
    return list(topologies.get_topology_desc(name, "tpu", wrap=spec.wrap, **kwargs).devices)


def kinds(mesh: Any, model: ModelSpec, train: TrainSpec) -> dict[str, tuple[int, int, int]]:
    """Per collective kind: ops, runs a step, bytes a step per device."""
    step = make_step(mesh, model, train, batch_axes=("data", "fsdp"))
    text = step.fn.lower(*step.abstract_args()).compile().as_text()
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in collectives(HloText(text), mesh.devices.size, [d.id for d in mesh.devices.flat]):
        row = out[c.kind]
        row[0], row[1], row[2] = row[0] + 1, row[1] + c.count, row[2] + c.bytes * c.count
    return {k: (a, b, c) for k, (a, b, c) in sorted(out.items())}


def main() -> None:
    import numpy as np
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hardware", nargs="?", default="tpu-v5p-128")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--batch", type=int, default=0, help="global batch (default: 1 a chip)")
    args = parser.parse_args()
    hw = args.hardware
    if parse_hardware(hw).slices > 1:
        raise SystemExit(f"{hw}: one slice only (the raster order is jax's for one slice)")
    tiny = ModelSpec.from_name("tiny")
    model = dataclasses.replace(tiny, d_model=args.d_model, d_ff=3 * args.d_model)
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hw), selector=hw)
    mesh = plan.to_jax_mesh()
    shape = tuple(mesh.devices.shape)
    train = TrainSpec(global_batch=args.batch or mesh.devices.size)
    wrapped = wrapped_devices(hw)
    by_coords = {(tuple(d.coords), d.core_on_chip): d for d in wrapped}
    same_order = np.array(
        [by_coords[(tuple(d.coords), d.core_on_chip)] for d in mesh.devices.flat]
    ).reshape(shape)
    ways = {
        "plan": mesh,
        "plan+wrap": Mesh(same_order, mesh.axis_names),
        "raster+wrap": Mesh(mesh_utils.create_device_mesh(shape, wrapped), mesh.axis_names),
    }
    print(f"{hw} mesh {dict(mesh.shape)} wrap {parse_hardware(hw).wrap} d_model {model.d_model}")
    for name, m in ways.items():
        cells = ", ".join(
            f"{k} {n} ops x{runs} {b / 1e6:.2f} MB"
            for k, (n, runs, b) in kinds(m, model, train).items()
        )
        print(f"  {name:12s} {cells}")


if __name__ == "__main__":
    main()
