"""A tiny DeepSeek-style step (latent attention, a dense layer then MoE layers) compiled by
libtpu for a v5p-16: the splash kernel takes values narrower than the queries and keys, and the
estimate's fsdp bytes stay within the referee's 25% of the compiled program's. (Its memory, a
few MB, is the compiler's fixed buffers more than the model's: bench_cost's shrunk DeepSeek
cases referee memory.)"""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import TrainSpec

from ..workload.test_mla import MLA


@pytest.mark.compile
@pytest.mark.slow
def test_latent_attention_compiles_for_tpu_and_its_gathers_are_counted():
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices("tpu-v5p-16"))
    train = TrainSpec(global_batch=8)
    report = compile_step(plan, MLA, train)
    assert report.fits and report.attention == "splash"
    est = estimate(plan, MLA, train)
    compiled = sum(c.bytes * c.count for c in report.collectives if c.spans == ("fsdp",))
    assert abs(est.axes["fsdp"].bytes / compiled - 1) <= 0.25  # measured: 1.02
