"""A pipelined step compiled by libtpu for a v5p-16 (8 chips): LLaMA 3 8B cut to four layers on
pipeline 2 x fsdp 4; and by XLA's CUDA compiler for two 8-GPU hosts with cuDNN attention.
Activations go from stage to stage by collective-permutes over the pipeline axis's device
groups, once an iteration of the schedule (the bubble included). The 1F1B step on a v5p-128
(pipeline 4 x fsdp 16) is given less memory than GPipe's, and compiles for GPUs too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.replica_groups import group_axes
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.view.compile import render_report
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step
from loadax_mesh.workload.timetable import one_f_one_b


@pytest.mark.compile
@pytest.mark.slow
def test_a_pipelined_step_compiles_with_collective_permutes_on_the_pipeline_axis():
    config = MeshConfig((2, 4), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    plan = config.plan(topology_devices("tpu-v5p-16"))
    model = replace(ModelSpec.from_name("llama3-8b"), num_layers=4)
    report = compile_step(plan, model, TrainSpec(global_batch=16))
    assert report.mesh == {"pipeline": 2, "fsdp": 4} and report.fits
    # the recipe compiled, resolved: as many micro-batches as stages, every layer pipelined
    assert report.train is not None
    assert (report.train.pipeline_microbatches, report.train.pipeline_layers) == (2, 4)
    assert report.to_dict()["train"]["pipeline_microbatches"] == 2
    text = render_report(report, [])
    assert "pipeline   2 stages, pipeline microbatches 2, repeats 1, layers 4" in text
    assert "remat per layer, schedule gpipe" in text
    assert report.moe is None and "moe " not in text
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
def test_a_pipelined_gpu_step_compiles_with_cudnn_attention():
    """XLA's CUDA compiler, two 8-GPU hosts as pipeline 2 x fsdp 8, the default attention:
    jax's cuDNN kernel runs inside the stages (attention.py: under a shard_map manual over the
    fsdp axis too, where jax's own partitioner for it fails), forward and backward, and the
    stages send their activations by collective-permutes on the pipeline axis."""
    plan = MeshConfig((2, 8), ("pipeline", "fsdp"), batch_axis_names=("fsdp",)).plan(
        topology_devices("gpu-p5.48xlarge-16")
    )
    model = replace(
        ModelSpec.from_name("llama3-8b"),
        num_layers=2,
        d_model=1024,
        d_ff=2048,
        num_heads=8,
        num_kv_heads=4,
        seq_len=1024,
        vocab_size=4096,
    )
    step = make_step(plan.to_jax_mesh(), model, TrainSpec(global_batch=32), batch_axes=("fsdp",))
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    kernels = [
        i.attributes
        for body in hlo.computations.values()
        for i in body
        if i.opcode == "custom-call" and "__cudnn$fmha" in i.attributes
    ]
    assert any("Backward" in k for k in kernels) and any("Backward" not in k for k in kernels)
    shape = dict(step.mesh.shape)
    on_pipeline = [
        c
        for c in collectives(hlo, 16)
        if c.kind == "collective-permute"
        and group_axes(c.groups, shape, pairs=True) == ("pipeline",)
    ]
    # 2 micro-batches of 16 rows, 2 a GPU: [2, 1024, 1024] in bfloat16, once an iteration
    assert step.stages is not None and step.stages.iterations == 3
    sent = [c for c in on_pipeline if c.count == 3 and c.bytes == 2 * 1024 * 1024 * 2]
    assert len(sent) >= 2, on_pipeline  # forward and backward


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("axis, size", [("model", 4), ("seq", 2)])
def test_the_estimate_of_a_pipeline_beside_a_tensor_or_sequence_axis_meets_the_compile(axis, size):
    """pipeline 2 x fsdp 2 x (tensor 4 or sequence 2) on a v5p, four layers: the estimate's
    bytes on the pipeline axis and on the other within 25% of the compiled step's (those of
    its collectives that span that axis alone; benchmarks/bench_cost.py's target)."""

    config = MeshConfig((2, 2, size), ("pipeline", "fsdp", axis), batch_axis_names=("fsdp",))
    plan = config.plan(topology_devices(f"tpu-v5p-{2 * 4 * size}"))
    model = replace(ModelSpec.from_name("llama3-8b"), num_layers=4)
    train = TrainSpec(global_batch=16)
    report = compile_step(plan, model, train)
    est = estimate(plan, model, train)
    for a in ("pipeline", axis):
        got = sum(c.bytes * c.count for c in report.collectives if set(c.spans) == {a})
        assert est.axes[a].bytes == pytest.approx(got, rel=0.25), a


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("repeats", [1, 2])
def test_the_1f1b_step_compiles_below_gpipes_memory(repeats):
    """tpu-v5p-128 as pipeline 4 x fsdp 16, LLaMA 3 8B cut to eight layers, 16 micro-batches
    of one row a chip: the 1F1B step (interleaved at repeats 2) sends a micro-batch's
    activations forward and its gradients back by collective-permutes on the pipeline axis,
    one a tick of each of its three loops (timetable.py), and libtpu's buffer assignment gives
    it less memory than GPipe's (circular) at the same M: a stage keeps 2 S - 1 micro-batches'
    layer inputs (at repeats 1), not all M + S - 1 iterations'. The logits in 16 chunks, so
    that the head's logits (whole batch after GPipe, one micro-batch in a 1F1B tick) weigh
    little in memory."""
    plan = MeshConfig((4, 16), ("pipeline", "fsdp"), batch_axis_names=("fsdp",)).plan(
        topology_devices("tpu-v5p-128")
    )
    model = replace(ModelSpec.from_name("llama3-8b"), num_layers=8)
    train = TrainSpec(
        global_batch=256, pipeline_microbatches=16, pipeline_repeats=repeats, logits_chunks=16
    )
    ours = compile_step(plan, model, replace(train, pipeline_schedule="1f1b"))
    assert ours.fits and ours.train is not None and ours.train.pipeline_schedule == "1f1b"
    assert ours.to_dict()["train"]["pipeline_schedule"] == "1f1b"
    text = render_report(ours, [])
    assert f"repeats {repeats}, layers 8, remat per layer, schedule 1f1b" in text
    activations = 1 * model.seq_len * model.d_model * 2  # a micro-batch's row, bfloat16
    sent = sorted(
        c.count
        for c in ours.collectives
        if c.kind == "collective-permute" and c.axes == ("pipeline",) and c.bytes == activations
    )
    tt = one_f_one_b(4, repeats, 16)
    assert sent == sorted([tt.warmup, tt.steady, tt.steady, tt.cooldown]), sent
    gpipe = compile_step(plan, model, train)
    assert gpipe.train is not None and gpipe.train.pipeline_schedule == "gpipe"
    assert ours.assigned_bytes is not None and gpipe.assigned_bytes is not None
    assert ours.assigned_bytes < gpipe.assigned_bytes, (ours.assigned_bytes, gpipe.assigned_bytes)
    # the cost model's 1F1B (cost/pipeline/memory.py): its memory within 20% of the program's;
    # its step GPipe's work, the head on a stage's slice of the vocabulary, plus the head's
    # sums over the pipeline axis: within 10% of GPipe's. Its FLOPs against GPipe's as the
    # programs' (both leave out the splash kernel, a custom call XLA's count cannot see:
    # compiler/flops.py), at R = 1 (at R > 1 the head runs in a conditional, which the count
    # takes on every tick); with every stage running the whole head it was 1.5 times GPipe's.
    est = estimate(plan, model, replace(train, pipeline_schedule="1f1b"))
    assert 0.8 <= est.memory_bytes / ours.total_bytes <= 1.2, est.memory
    plain = estimate(plan, model, train)
    assert 1.0 < est.step_seconds / plain.step_seconds <= 1.1
    if repeats == 1:
        assert ours.flops is not None and gpipe.flops is not None
        programs = ours.flops / gpipe.flops
        assert est.flops / plain.flops == pytest.approx(programs, rel=0.05), programs


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("repeats", [1, 2])
def test_the_1f1b_gpu_step_compiles_with_cudnn_attention(repeats):
    """XLA's CUDA compiler, two 8-GPU hosts as pipeline 2 x fsdp 8, 4 micro-batches: the 1F1B
    step runs jax's cuDNN attention forward (the forward slots) and backward (the backward
    slots' vjp), and sends by collective-permutes on the pipeline axis (a one-tick loop's
    last send, which no stage receives, is left out of the program)."""
    plan = MeshConfig((2, 8), ("pipeline", "fsdp"), batch_axis_names=("fsdp",)).plan(
        topology_devices("gpu-p5.48xlarge-16")
    )
    model = replace(
        ModelSpec.from_name("llama3-8b"),
        num_layers=4,
        d_model=1024,
        d_ff=2048,
        num_heads=8,
        num_kv_heads=4,
        seq_len=1024,
        vocab_size=4096,
    )
    train = TrainSpec(
        global_batch=64,
        pipeline_microbatches=4,
        pipeline_repeats=repeats,
        pipeline_schedule="1f1b",
    )
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=("fsdp",))
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    kernels = [
        i.attributes
        for body in hlo.computations.values()
        for i in body
        if i.opcode == "custom-call" and "__cudnn$fmha" in i.attributes
    ]
    assert any("Backward" in k for k in kernels) and any("Backward" not in k for k in kernels)
    shape = dict(step.mesh.shape)
    sent = [
        c.count
        for c in collectives(hlo, 16)
        if c.kind == "collective-permute"
        and group_axes(c.groups, shape, pairs=True) == ("pipeline",)
        and c.bytes == 2 * 1024 * 1024 * 2  # 16 rows a micro-batch, 2 a GPU, bfloat16
    ]
    tt = one_f_one_b(2, repeats, 4)
    assert tt.steady in sent and sum(sent) >= 2 * tt.steady, sent
