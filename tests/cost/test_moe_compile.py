"""The MoE cost terms against libtpu: a tiny MoE step on a v5p-16 (8 chips), fsdp 2 x expert 4."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec

MOE = replace(
    ModelSpec.from_name("tiny"), name="tiny-moe", num_experts=8, experts_per_token=2, moe_d_ff=128
)


@pytest.mark.compile
@pytest.mark.slow
def test_all_to_all_bytes_are_the_compiled_steps():
    from loadax_mesh.compiler.report import compile_step

    plan = MeshConfig.from_preset("fsdp_ep").plan(topology_devices("tpu-v5p-16"))
    train = TrainSpec(global_batch=8, remat="full")
    report = compile_step(plan, MOE, train)
    compiled = sum(c.bytes * c.count for c in report.collectives if c.kind == "all-to-all")
    assert compiled == estimate(plan, MOE, train).axes["expert"].bytes
