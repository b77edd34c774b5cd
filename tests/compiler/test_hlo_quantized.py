"""Counting the FLOPs of low-precision matmuls in an optimised HLO module
(`flops.quantized_flops`): dots (a GPU Triton GEMM fusion's), libtpu's matmuls written as
convolutions, cuBLAS's fp8 GEMM calls and libtpu's grouped matmuls, loop trips counted."""

from __future__ import annotations

import pytest

from loadax_mesh.compiler.flops import quantized_flops, step_flops
from loadax_mesh.compiler.hlo import HloText

# A loop of 4 trips whose body runs: an fp8 dot inside a GEMM fusion (XLA's GPU form), a
# bfloat16 dot (not low precision), an int8 one against bfloat16 (not both low), and an int8
# matmul as libtpu writes a projection "bsd,dhk->bshk" (d = 2 x 32 per device, heads as a
# padded window). Outside it: a cuBLAS fp8 GEMM call and libtpu's grouped matmul of int8
# rows against 4 experts, and one of bfloat16 operands.
MODULE = """HloModule jit_step, entry_computation_layout={(f8e4m3fn[64,128]{1,0})->f32[64,256]{1,0}}

%gemm_fusion (p0: f8e4m3fn[64,128], p1: bf16[128,256]) -> f32[64,256] {
  %p0 = f8e4m3fn[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  %c1 = f8e5m2[128,256]{1,0} convert(%p1)
  ROOT %d = f32[64,256]{1,0} dot(%p0, %c1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f8e4m3fn[64,128])) -> (s32[], f8e4m3fn[64,128]) {
  %p = (s32[], f8e4m3fn[64,128]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f8e4m3fn[64,128]{1,0} get-tuple-element(%p), index=1
  %w = bf16[128,256]{1,0} constant({...})
  %f = f32[64,256]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %xb = bf16[64,128]{1,0} convert(%x)
  %plain = bf16[64,256]{1,0} dot(%xb, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %xi = s8[64,128]{1,0} convert(%x)
  %mixed = bf16[64,256]{1,0} dot(%xi, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %h = s8[8,2,32,1]{3,2,1,0} constant({...})
  %k = s8[2,32,4,16]{3,2,1,0} constant({...})
  %conv = s32[8,4,16,1]{3,2,1,0} convolution(%h, %k), window={size=4x2 pad=3_3x0_0 rhs_reversal=1x0}, dim_labels=b1f0_1i0o->b0f1
  ROOT %t = (s32[], f8e4m3fn[64,128]) tuple(%i, %x)
}

%cond (p: (s32[], f8e4m3fn[64,128])) -> pred[] {
  %p = (s32[], f8e4m3fn[64,128]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: f8e4m3fn[64,128]) -> f32[64,256] {
  %x = f8e4m3fn[64,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f8e4m3fn[64,128]) tuple(%zero, %x)
  %loop = (s32[], f8e4m3fn[64,128]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %b = f8e4m3fn[256,128]{1,0} constant({...})
  %one = f32[] constant(1)
  %gemm = (f32[64,256]{1,0}, s8[1024]{0}) custom-call(%x, %b, %one, %one), custom_call_target="__cublas$lt$matmul$f8", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %groups = s32[5]{0} constant({10, 20, 30, 64, 0})
  %rows = s8[64,128]{1,0} convert(%x)
  %experts = s8[4,128,32]{2,1,0} constant({...})
  %grouped = s32[64,32]{1,0} custom-call(%groups, %rows, %experts), custom_call_target="tpu_custom_call", operand_layout_constraints={s32[5]{0}, s8[64,128]{1,0}, s8[4,128,32]{2,1,0}}, frontend_attributes={ragged_dot_tiling="128,128,64"}
  %rows16 = bf16[64,128]{1,0} convert(%x)
  %experts16 = bf16[4,128,32]{2,1,0} constant({...})
  %wide = bf16[64,32]{1,0} custom-call(%groups, %rows16, %experts16), custom_call_target="tpu_custom_call", operand_layout_constraints={s32[5]{0}, bf16[64,128]{1,0}, bf16[4,128,32]{2,1,0}}, frontend_attributes={ragged_dot_tiling="128,128,64"}
  ROOT %out = f32[64,256]{1,0} get-tuple-element(%gemm), index=0
}
"""

FUSED = 2 * 64 * 128 * 256  # fp8 x e5m2 (the convert fused into the GEMM)
PROJECTION = 2 * (8 * 4 * 16) * (2 * 32)  # each output element sums over d = 2 x 32
GEMM = 2 * 64 * 256 * 128
GROUPED = 2 * 64 * 128 * 32  # each row meets one expert


def test_low_precision_matmuls_counted_per_trip():
    hlo = HloText(MODULE)
    assert quantized_flops(hlo) == 4 * (FUSED + PROJECTION) + GEMM + GROUPED


def test_the_kernels_count_in_the_steps_flops_too():
    """XLA's analysis gives each custom call -1; the cuBLAS GEMM and libtpu's grouped
    matmuls (int8 and bfloat16) are counted from their shapes instead, so the quantized
    FLOPs are a part of the step's."""
    hlo = HloText(MODULE)
    total = step_flops(None, hlo)
    assert total is not None
    assert total >= quantized_flops(hlo) + 4 * 2 * (2 * 64 * 128 * 256) + GROUPED


def test_a_matmul_whose_size_cannot_be_read_gives_no_figure():
    broken = MODULE.replace('"lhs_contracting_dimensions":["1"]', '"lhs_contracting_dimensions":[]')
    assert quantized_flops(HloText(broken)) is None
    assert quantized_flops(HloText(MODULE.replace("f8e4m3fn", "bf16").replace("s8[", "bf16["))) == 0


@pytest.mark.parametrize("target", ["__cublas$lt$matmul", "__cublas$gemm"])
def test_a_cublas_int8_or_bf16_gemm(target):
    """cuBLAS's int8 GEMM (`__cublas$lt$matmul`, s8 x s8 -> s32) counts; a bfloat16 one not."""
    text = MODULE.replace("__cublas$lt$matmul$f8", target)
    int8 = text.replace("%b = f8e4m3fn[256,128]", "%b = s8[256,128]").replace(
        "custom-call(%x, %b", "custom-call(%rows, %b"
    )
    assert quantized_flops(HloText(int8)) == 4 * (FUSED + PROJECTION) + GEMM + GROUPED
    wide = text.replace("%b = f8e4m3fn[256,128]", "%b = bf16[256,128]")
    assert quantized_flops(HloText(wide)) == 4 * (FUSED + PROJECTION) + GROUPED


def test_the_report_and_its_text_give_the_share():
    from loadax_mesh.compiler.report import CompileReport
    from loadax_mesh.view.compile import render_report
    from loadax_mesh.workload import TrainSpec

    def report(quantization: str, low: float) -> CompileReport:
        return CompileReport(
            hardware="gpu-p5.48xlarge-8", mesh={"fsdp": 8}, model="llama3-8b", global_batch=8,
            remat="full", attention="cudnn", compile_seconds=1.0, argument_bytes=1,
            output_bytes=1, temp_bytes=1, alias_bytes=1, total_bytes=2, hbm_bytes=None,
            fits=None, flops=8.0e13, collectives=(), quantized_flops=low,
            train=TrainSpec(global_batch=8, quantization=quantization),
        )  # fmt: skip

    fp8 = report("fp8", 5.0e13)
    assert fp8.to_dict()["quantized_flops"] == 5.0e13
    text = render_report(fp8, [])
    assert "attention cudnn, quantization fp8" in text
    assert "           5.000e+13 of them (62%) in matmuls of fp8 or int8 operands" in text
    plain = render_report(report("none", 0.0), [])
    assert "quantization" not in plain and "of them" not in plain
