"""attention="plain" compiled for one H100 (XLA's CUDA compile-only client): the estimate
prices the step the compiler builds, not the fused kernel (cost/parts/plain_attention.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, topology_devices
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec

HARDWARE = "gpu-p5.48xlarge-8"
# LLaMA-3 8B's widths cut by 4, 2 layers, a vocabulary of 8192: the scores (4 rows x 8 heads x
# 2048 x 2048) weigh as much as the rest of the layer
SMALL = replace(
    ModelSpec.from_name("llama3-8b"),
    num_layers=2, d_model=1024, d_ff=3584, vocab_size=8192, num_heads=8, num_kv_heads=2,
    seq_len=2048,
)  # fmt: skip


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("remat", ["full", "dots_attention"])
def test_plain_attention_is_priced_at_or_above_its_compiled_roofline(remat: str) -> None:
    """The compiled plain step's roofline (its matmuls over the whole square and its passes
    over the scores) is no longer than the estimate, which counts the whole square's FLOPs as
    the compiler does; the fused kernel's estimate is the shorter."""
    config = MeshConfig(mesh_shape=(1,), mesh_axis_names=("fsdp",), batch_axis_names=("fsdp",))
    plan = config.plan(topology_devices(HARDWARE)[:1], selector=HARDWARE)
    plain = TrainSpec(global_batch=4, remat=remat, attention="plain")
    est = estimate(plan, SMALL, plain)
    report = compile_step(plan, SMALL, plain)
    assert report.attention == "plain"
    assert report.roofline_seconds is not None and report.flops is not None
    assert report.roofline_seconds <= est.step_seconds
    assert est.flops == pytest.approx(report.flops, rel=0.02)
    fused = estimate(plan, SMALL, replace(plain, attention="flash"))
    assert fused.step_seconds < est.step_seconds
