"""The pipelined step's FLOPs, estimated against the program's on 8 CPU devices (every loop
trip counted: compiler/flops.py): GPipe runs the head after its stages on a device's rows split
over the pipeline axis, 1F1B on every micro-batch of the replica's rows in the tick the last
stage ends it, each stage on its slice of the vocabulary (workload/pipeline_1f1b.py): the same
work. A 32k vocabulary over d_model 256 makes the head most of the work, so a 1F1B step whose
stages each ran the whole head would be S times it (the program's count was so before the
vocabulary was cut)."""

from __future__ import annotations

from dataclasses import replace

import jax
import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.compiler.flops import step_flops
from loadax_mesh.compiler.hlo import HloText
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

MODEL = replace(
    ModelSpec.from_name("llama3-8b"),
    num_layers=4,
    d_model=256,
    d_ff=512,
    num_heads=4,
    num_kv_heads=2,
    seq_len=256,
    vocab_size=32768,
)


@pytest.mark.slow
@pytest.mark.parametrize("schedule, stages", [("gpipe", 2), ("1f1b", 2), ("1f1b", 4)])
def test_the_estimated_flops_of_either_schedule_meet_the_programs(stages, schedule):
    config = MeshConfig((stages, 8 // stages), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    train = TrainSpec(
        global_batch=32, pipeline_microbatches=8, pipeline_schedule=schedule, remat="full"
    )
    step = make_step(config.plan(jax.devices()).to_jax_mesh(), MODEL, train, batch_axes="fsdp")
    compiled = step.fn.lower(*step.abstract_args()).compile()
    program = step_flops(compiled, HloText(compiled.as_text()))
    assert program is not None
    # the estimate on a catalogue chip of the same mesh (FLOPs do not depend on the chip)
    est = estimate(config.plan(simulate_devices("tpu-v5p-16")), MODEL, train)
    assert 0.9 <= est.flops / program <= 1.05, (est.flops, program)
