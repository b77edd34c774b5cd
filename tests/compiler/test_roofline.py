"""The compiled program's roofline, per operation, every loop trip counted (libtpu)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from loadax_mesh import topology_devices
from loadax_mesh.compiler.roofline import roofline

pytestmark = [pytest.mark.compile, pytest.mark.slow]

PEAK, HBM = 918e12, 1.638e12  # a v6e chip's bf16 peak and HBM bandwidth (catalogue)


def compiled_text(fn, *shapes) -> str:
    """`fn` compiled for one v6e chip on arguments of `shapes`: each a shape (bfloat16) or a
    (shape, dtype) pair."""
    device = topology_devices("tpu-v6e-1")[0]
    sharding = NamedSharding(Mesh([device], ("x",)), P())
    typed = [s if isinstance(s[0], tuple) else (s, jnp.bfloat16) for s in shapes]
    args = [jax.ShapeDtypeStruct(s, t, sharding=sharding) for s, t in typed]
    return jax.jit(fn).lower(*args).compile().as_text()


def test_a_large_matmul_is_bound_by_its_flops() -> None:
    m, k, n = 8192, 4096, 14336
    r = roofline(compiled_text(jnp.matmul, (m, k), (k, n)), peak_flops=PEAK, hbm_bandwidth=HBM)
    assert r is not None
    assert r.flops == pytest.approx(2 * m * k * n, rel=0.01)
    assert r.seconds == pytest.approx(2 * m * k * n / PEAK, rel=0.01)
    assert r.compute_seconds == pytest.approx(r.seconds) and r.memory_seconds == 0


def test_an_elementwise_op_is_bound_by_its_bytes() -> None:
    shape = (8192, 14336)
    text = compiled_text(lambda a, b: jax.nn.silu(a) * b, shape, shape)
    r = roofline(text, peak_flops=PEAK, hbm_bandwidth=HBM)
    assert r is not None
    moved = 3 * 2 * 8192 * 14336  # two bf16 inputs read, one written
    assert r.bytes == pytest.approx(moved, rel=0.01)
    assert r.seconds == pytest.approx(moved / HBM, rel=0.01) == r.memory_seconds


def test_every_trip_of_a_loop_counts() -> None:
    def stack(x, w):
        def layer(h, _):
            return jnp.tanh(h @ w), None

        return jax.lax.scan(layer, x, None, length=8)[0]

    one = roofline(compiled_text(lambda x, w: jnp.tanh(x @ w), (512, 1024), (1024, 1024)),
                   peak_flops=PEAK, hbm_bandwidth=HBM)  # fmt: skip
    eight = roofline(compiled_text(stack, (512, 1024), (1024, 1024)), peak_flops=PEAK,
                     hbm_bandwidth=HBM)  # fmt: skip
    assert one is not None and eight is not None
    assert eight.flops == pytest.approx(8 * one.flops, rel=0.02)
    assert eight.seconds >= 8 * one.seconds  # each trip at least the work of one (plus its copies)


def test_a_compile_report_carries_the_steps_roofline() -> None:
    from loadax_mesh import MeshConfig, ModelSpec, TrainSpec, compile_step
    from loadax_mesh.view.compile import render_report

    hardware = "tpu-v5litepod-8"
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hardware), selector=hardware)
    report = compile_step(plan, ModelSpec.from_name("tiny"), TrainSpec(global_batch=16))
    assert report.roofline_seconds is not None
    # at least the FLOPs at the chip's peak (197 TFLOP/s a v5e), kernels included
    assert report.flops is not None and report.roofline_seconds >= report.flops / 197e12 * 0.99
    assert report.to_dict()["roofline_seconds"] == report.roofline_seconds
    assert "roofline   " in render_report(report, [])


def test_a_step_that_offloads_to_host_memory_has_a_roofline() -> None:
    # its asynchronous transfers to and from host memory run by DMA, beside the cores: the
    # roofline leaves them out rather than giving no figure for the whole step
    from loadax_mesh import MeshConfig, ModelSpec, TrainSpec, compile_step
    from loadax_mesh.workload.spec import parse_remat

    hardware = "tpu-v6e-8"
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hardware), selector=hardware)
    train = TrainSpec(global_batch=8, remat=parse_remat("layer_input=offload,query=offload"))
    report = compile_step(plan, ModelSpec.from_name("tiny"), train)
    assert report.host_bytes  # it does offload
    assert report.roofline_seconds is not None and report.flops is not None
    assert report.roofline_seconds >= report.flops / 918e12 * 0.99  # v6e's peak, kernels in


def test_a_step_whose_collectives_run_on_sparsecores_has_a_roofline() -> None:
    # TPU7x's compiler moves the weight gathers onto the SparseCores as asynchronous calls
    # (call-start / call-done); the TensorCores' roofline leaves them out
    from loadax_mesh import MeshConfig, ModelSpec, TrainSpec
    from loadax_mesh.workload.step import make_step

    hardware = "tpu-7x-8"
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hardware), selector=hardware)
    step = make_step(
        plan.to_jax_mesh(), ModelSpec.from_name("tiny"), TrainSpec(global_batch=8),
        batch_axes=plan.batch_axis_names,
    )  # fmt: skip
    text = step.fn.lower(*step.abstract_args()).compile().as_text()
    assert "call-start(" in text and 'async_execution_thread="sparsecore"' in text
    peak = 2307e12 / 2  # a TensorCore's share of a TPU7x chip (catalogue)
    r = roofline(text, peak_flops=peak, hbm_bandwidth=7.4e12 / 2)
    assert r is not None and r.flops > 0
    assert r.seconds >= r.flops / peak


def test_a_v4_tensorcore_step_is_priced_at_half_a_chip() -> None:
    # libtpu's compile-only v4 devices are TensorCores: each runs half a chip's program, at half
    # its peak (275 TFLOP/s) and HBM bandwidth (1200 GB/s), where the catalogue's device is the
    # whole megacore chip
    from loadax_mesh import MeshConfig, ModelSpec, TrainSpec, compile_step
    from loadax_mesh.workload.step import make_step

    hardware = "tpu-v4-8"
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices(hardware), selector=hardware)
    model, train = ModelSpec.from_name("tiny"), TrainSpec(global_batch=16)
    report = compile_step(plan, model, train)
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    text = step.fn.lower(*step.abstract_args()).compile().as_text()
    core = roofline(text, peak_flops=275e12 / 2, hbm_bandwidth=1200e9 / 2)
    assert core is not None and report.mesh == {"data": 1, "fsdp": 8}
    assert report.roofline_seconds == pytest.approx(core.seconds, rel=1e-6)


def test_matmuls_of_fp8_operands_run_at_the_fp8_peak() -> None:
    """An fp8 matmul's FLOPs are priced at the fp8 peak (twice the bfloat16 one here: half the
    time), the same program's bfloat16 matmul at the peak; a program with fp8 matmuls and no
    fp8 peak given has no roofline (no figure rather than a low one)."""
    m = k = n = 4096
    fp8 = compiled_text(
        lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32),
        ((m, k), jnp.float8_e4m3fn),
        ((k, n), jnp.float8_e4m3fn),
    )
    at_fp8 = roofline(fp8, peak_flops=PEAK, hbm_bandwidth=HBM, peak_fp8=2 * PEAK)
    at_bf16 = roofline(fp8, peak_flops=PEAK, hbm_bandwidth=HBM, peak_fp8=PEAK)
    assert at_fp8 is not None and at_bf16 is not None
    assert at_fp8.flops == at_bf16.flops == 2 * m * k * n
    assert at_fp8.seconds == pytest.approx(at_bf16.seconds / 2, rel=0.02)
    assert roofline(fp8, peak_flops=PEAK, hbm_bandwidth=HBM) is None
    bf16 = compiled_text(jnp.matmul, (m, k), (k, n))
    plain = roofline(bf16, peak_flops=PEAK, hbm_bandwidth=HBM, peak_fp8=2 * PEAK)
    assert plain is not None and plain.seconds == pytest.approx(at_bf16.seconds, rel=0.05)
