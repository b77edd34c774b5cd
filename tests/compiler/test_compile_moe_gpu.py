"""The MoE step on GPU as XLA's CUDA client compiles it: the dropless experts run tokamax's
grouped kernel (Mosaic GPU custom calls counted from their shapes), never the dense rewrite of
jax's ragged_dot; the estimate prices that program (memory, FLOPs, roofline)."""

from __future__ import annotations

import builtins
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, topology_devices
from loadax_mesh.compiler.flops import grouped_matmul_flops
from loadax_mesh.compiler.hlo import HloText, call_target
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.kernels import grouped_matmul
from loadax_mesh.workload.step import make_step

HOST = "gpu-p5e.48xlarge-8"
# Mixtral's layout at a width that compiles in seconds: 8 experts, 2 per token, 2 layers.
MOE = replace(
    ModelSpec.from_name("mixtral-8x7b"),
    name="mixtral-small",
    num_layers=2,
    d_model=1024,
    num_heads=8,
    num_kv_heads=2,
    head_dim=128,
    moe_d_ff=2048,
    vocab_size=4096,
    seq_len=4096,
)


def _call(shape: str, operands: str) -> HloText:
    text = (
        "HloModule m\n\nENTRY %e () -> bf16[] {\n"
        f'  %k = {shape} custom-call(), custom_call_target="mosaic_gpu_v2", '
        f"operand_layout_constraints={{{operands}}}\n}}\n"
    )
    return HloText(text)


def _only(hlo: HloText):
    return next(i for body in hlo.computations.values() for i in body)


def test_grouped_matmul_flops_by_hand():
    """2 M K N for M rows each meeting one expert, whichever pass: the forward (rows x the
    experts' weights, int32 tile tables beside them), and the weights' gradient (the rows as
    [K, M] with the output's gradient [M, N])."""
    forward = _call("bf16[8192,14336]{1,0}", "s32[135]{0}, s32[135]{0}, bf16[8192,4096]{1,0}, "
                    "bf16[8,4096,14336]{2,1,0}")  # fmt: skip
    weights = _call(
        "bf16[8,14336,4096]{2,1,0}", "s32[8]{0}, s32[8]{0}, bf16[14336,8192]{1,0}, bf16[8192,4096]"
    )
    expected = 2 * 8192 * 4096 * 14336
    assert grouped_matmul_flops(_only(forward)) == expected
    assert grouped_matmul_flops(_only(weights)) == expected
    # A Mosaic GPU kernel of another shape: no figure rather than a wrong one.
    other = _call("bf16[64,64]{1,0}", "bf16[64,32]{1,0}, bf16[32,64]{1,0}, bf16[64,64]{1,0}")
    assert grouped_matmul_flops(_only(other)) is None


def test_gpu_dropless_without_tokamax_refuses(monkeypatch):
    real = builtins.__import__

    def no_tokamax(name, *args, **kwargs):
        if name == "tokamax":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokamax)
    with pytest.raises(MeshConfigError, match=r"platform='gpu'.*tokamax.*moe='capacity'"):
        grouped_matmul("gpu")


@pytest.fixture(scope="module")
def compiled():
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(HOST))
    return {
        moe: (compile_step(plan, MOE, TrainSpec(global_batch=8, moe=moe)), plan)
        for moe in ("dropless", "capacity")
    }


@pytest.mark.compile
@pytest.mark.slow
def test_dropless_runs_the_grouped_kernel_in_every_pass():
    """The grouped matmuls (forward, the recompute under full remat, the rows' and the
    weights' gradients) are tokamax's kernels, each counted from its shapes; no dot over
    every expert (test_the_estimate_prices_the_gpu_moe_program: the step's FLOPs are the
    routed rows')."""
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(HOST))
    step = make_step(plan.to_jax_mesh(), MOE, TrainSpec(global_batch=8), batch_axes=("fsdp",))
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    kernels = [
        i
        for body in hlo.computations.values()
        for i in body
        if i.opcode == "custom-call" and call_target(i).startswith("mosaic_gpu")
    ]
    assert kernels and all(grouped_matmul_flops(k) for k in kernels)


@pytest.mark.compile
@pytest.mark.slow
def test_the_estimate_prices_the_gpu_moe_program(compiled):
    for moe, (report, plan) in compiled.items():
        est = estimate(plan, MOE, TrainSpec(global_batch=8, moe=moe))
        assert 0.8 <= est.memory_bytes / report.total_bytes <= 1.2, (moe, est.memory)
        assert report.roofline_seconds <= 1.05 * est.step_seconds, moe
        assert report.flops is not None
        assert abs(est.flops / report.flops - 1) < 0.1, moe
    dropless, capacity = (compiled[m][0].total_bytes for m in ("dropless", "capacity"))
    assert dropless <= 1.1 * capacity
