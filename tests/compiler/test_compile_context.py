"""Context parallelism compiled for a seq axis of 4 (docs/design.md section 14): LLaMA-3 8B cut
to 2 layers at 32k tokens on tpu-v5p-16 (splash, its mask's query rows at the load-balanced
positions) and at 64k on gpu-p5.48xlarge-8 (cuDNN under a shard_map, its mask from positions):
each fits, its keys and values are all-gathered over seq each layer (their gradients
reduce-scattered there), and its weights are cut over fsdp and seq together. Also the
sliding-window layers' kernels with the sequence split: splash's local mask and cuDNN's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.hlo import HloText
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

LLAMA = ModelSpec.from_name("llama3-8b")
SEQ = 4


def _plan(hardware: str):
    devices = topology_devices(hardware)
    names = ("fsdp", "seq")
    config = MeshConfig((len(devices) // SEQ, SEQ), names, batch_axis_names=("fsdp",))
    return config.plan(devices, selector=hardware)


def _kv_gathers(report, model: ModelSpec, rows: int) -> list:
    """The all-gathers over seq of one layer's keys or values: [rows, seq_len, kv_heads,
    head_dim] in bfloat16 whole on each device."""
    kv = rows * model.seq_len * model.num_kv_heads * model.head_dim * 2
    return [
        c
        for c in report.collectives
        if c.kind == "all-gather" and c.axes == ("seq",) and c.bytes == kv
    ]


@pytest.fixture(
    scope="module",
    params=[("tpu-v5p-16", 32768), ("gpu-p5.48xlarge-8", 65536)],
    ids=["tpu-v5p-16-32k", "gpu-p5-8-64k"],
)
def compiled(request):
    hardware, seq_len = request.param
    plan = _plan(hardware)
    model = replace(LLAMA, num_layers=2, seq_len=seq_len)
    train = TrainSpec(global_batch=plan.shape["fsdp"])  # a sequence a fsdp shard
    return hardware, plan, model, compile_step(plan, model, train)


@pytest.mark.compile
@pytest.mark.slow
def test_a_long_sequence_over_seq_4_fits(compiled):
    hardware, plan, model, report = compiled
    assert report.mesh == {"fsdp": plan.shape["fsdp"], "seq": SEQ}
    assert report.fits is True, report
    assert report.attention == ("splash" if hardware.startswith("tpu") else "cudnn")
    print(
        f"\n{hardware} {model.name} x2 layers seq_len {model.seq_len}: argument "
        f"{report.argument_bytes / 2**30:.2f} GiB, temp {report.temp_bytes / 2**30:.2f} GiB, "
        f"total {report.total_bytes / 2**30:.2f} GiB, assigned "
        f"{(report.assigned_bytes or 0) / 2**30:.2f} GiB, compile {report.compile_seconds:.1f} s"
    )


@pytest.mark.compile
@pytest.mark.slow
def test_keys_and_values_are_gathered_over_seq_each_layer(compiled):
    """The forward and the recompute of each of the 2 layers gather its keys and values over
    seq: 2 x 2 x 2 gathers of one device's [1, seq_len, 8, 128]; their gradients are reduced
    over seq once each, 4 a step (a reduce-scatter on GPU; libtpu makes it an all-reduce whose
    slice it fuses into the rotary's backward). The weights are gathered over fsdp and seq
    together; no weight's gradient is all-reduced over seq alone."""
    _, _, model, report = compiled
    assert sum(c.count for c in _kv_gathers(report, model, rows=1)) == 8, report.collectives
    kv = model.seq_len * model.num_kv_heads * model.head_dim * 2
    on_seq = [c for c in report.collectives if c.axes == ("seq",)]
    reduced = [c for c in on_seq if c.kind in ("reduce-scatter", "all-reduce") and c.bytes == kv]
    assert sum(c.count for c in reduced) == 4, on_seq
    assert not [c for c in on_seq if c.kind == "all-reduce" and c.bytes != kv], on_seq
    assert any(c.axes == ("fsdp", "seq") and c.kind == "all-gather" for c in report.collectives)


@pytest.mark.compile
@pytest.mark.slow
def test_the_gpu_step_runs_cudnn_with_its_mask_from_positions():
    """Over seq cuDNN's causal mask (the query block's diagonal) would be wrong for every shard
    but the first: the step gives cuDNN the mask from positions, as a bias, and the program's
    attention is cuDNN's fused custom call, forward and backward."""
    plan = _plan("gpu-p5.48xlarge-8")
    model = replace(LLAMA, num_layers=2, seq_len=8192)
    step = make_step(plan.to_jax_mesh(), model, TrainSpec(global_batch=2), batch_axes=("fsdp",))
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    targets = [
        i.attributes.split('custom_call_target="')[1].split('"')[0]
        for body in hlo.computations.values()
        for i in body
        if i.opcode == "custom-call" and "__cudnn$fmha" in i.attributes
    ]
    assert "__cudnn$fmhaScaleBiasSoftmax" in targets, targets
    assert "__cudnn$fmhaScaleBiasSoftmaxBackward" in targets, targets


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["tpu-v5p-8", "gpu-p5.48xlarge-8"])
def test_local_layers_compile_with_the_sequence_split(hardware):
    """Gemma 2's pattern (local, global) at a window of 1024 over a seq axis of 2, balanced."""
    devices = topology_devices(hardware)
    config = MeshConfig((len(devices) // 2, 2), ("fsdp", "seq"), batch_axis_names=("fsdp",))
    plan = config.plan(devices, selector=hardware)
    model = replace(LLAMA, num_layers=2, seq_len=8192, sliding_window=1024, global_every=2)
    report = compile_step(plan, model, TrainSpec(global_batch=len(devices) // 2))
    assert report.fits is True
    assert _kv_gathers(report, model, rows=1)
