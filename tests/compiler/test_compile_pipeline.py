"""A pipelined step compiled by libtpu for a v5p-16 (8 chips): LLaMA 3 8B cut to four layers on
pipeline 2 x fsdp 4. Activations go from stage to stage by collective-permutes over the
pipeline axis's device groups, once an iteration of the schedule (the bubble included)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec


@pytest.mark.compile
@pytest.mark.slow
def test_a_pipelined_step_compiles_with_collective_permutes_on_the_pipeline_axis():
    config = MeshConfig((2, 4), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    plan = config.plan(topology_devices("tpu-v5p-16"))
    model = replace(ModelSpec.from_name("llama3-8b"), num_layers=4)
    report = compile_step(plan, model, TrainSpec(global_batch=16))
    assert report.mesh == {"pipeline": 2, "fsdp": 4} and report.fits
    # 2 micro-batches (as many as stages) of 8 rows, 2 a chip: [2, 8192, 4096] in bfloat16,
    # sent M + S - 1 = 3 times forward and 3 times backward (the transposed permute)
    activations = 2 * model.seq_len * model.d_model * 2
    stages = [
        c
        for c in report.collectives
        if c.kind == "collective-permute" and c.axes == ("pipeline",) and c.count == 3
    ]
    assert len(stages) >= 2 and all(c.bytes == activations for c in stages), stages
    # (the pipeline acts as data outside the pipelined layers: the embedding's and the
    # unembedding's gradients are all-reduced over it)
    assert any(c.kind == "all-reduce" and c.axes == ("pipeline",) for c in report.collectives)


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("axis, size", [("model", 4), ("seq", 2)])
def test_the_estimate_of_a_pipeline_beside_a_tensor_or_sequence_axis_meets_the_compile(axis, size):
    """pipeline 2 x fsdp 2 x (tensor 4 or sequence 2) on a v5p, four layers: the estimate's
    bytes on the pipeline axis and on the other within 25% of the compiled step's (those of
    its collectives that span that axis alone; benchmarks/bench_cost.py's target)."""
    from loadax_mesh.cost import estimate

    config = MeshConfig((2, 2, size), ("pipeline", "fsdp", axis), batch_axis_names=("fsdp",))
    plan = config.plan(topology_devices(f"tpu-v5p-{2 * 4 * size}"))
    model = replace(ModelSpec.from_name("llama3-8b"), num_layers=4)
    train = TrainSpec(global_batch=16)
    report = compile_step(plan, model, train)
    est = estimate(plan, model, train)
    for a in ("pipeline", axis):
        got = sum(c.bytes * c.count for c in report.collectives if set(c.spans) == {a})
        assert est.axes[a].bytes == pytest.approx(got, rel=0.25), a
