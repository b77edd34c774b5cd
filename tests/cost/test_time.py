"""The step-time model term by term (cost/timing/step.py), counted by hand. No jax needed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.calibration import calibration
from loadax_mesh.cost.estimate import estimate_parts, plan_parts
from loadax_mesh.cost.parts.flops import op_flops
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.spec import TENSORS

LONG = ModelSpec(
    name="long", num_layers=4, d_model=4096, d_ff=16384, num_heads=32, num_kv_heads=8,
    head_dim=128, vocab_size=32768, seq_len=4096,
)  # fmt: skip
PEAK, HBM = 459e12, 2765e9  # one v5p chip (catalogue)


def plan(hardware: str, preset: str = "fsdp"):
    return MeshConfig.from_preset(preset).plan(simulate_devices(hardware), selector=hardware)


def test_big_matmuls_run_at_the_calibrated_share_of_peak() -> None:
    e = estimate(plan("tpu-v5p-16"), LONG, TrainSpec(global_batch=64, remat="none"))
    k = calibration("compute_efficiency", "tpu")
    d, f, h, kv, hd, L, V = 4096, 16384, 32, 8, 128, 4, 32768
    tokens = 8 * 4096  # 8 rows a device
    layer = 2 * d * (h + 2 * kv) * hd + 2 * h * hd * d + 3 * 2 * d * f
    projections = 3 * tokens * (L * layer + 2 * d * V)  # forward, and twice that backward
    assert e.time.matmul == pytest.approx(projections / (PEAK * k))
    pairs = 8 * 4096 * 4097 / 2  # causal, per row
    assert e.time.attention == pytest.approx(L * pairs * h * hd * (4 + 14) / (PEAK * k))
    assert e.compute_seconds == e.time.matmul + e.time.attention + e.time.memory_bound


def test_recompute_and_the_gpu_kernel() -> None:
    none, full = (
        estimate(plan("tpu-v5p-16"), LONG, TrainSpec(global_batch=64, remat=r))
        for r in ("none", "full")
    )
    # full remat runs every projection's forward again but the down projection's (nothing in
    # the backward pass reads its output), and the attention's forward kernel
    k, layer = (
        calibration("compute_efficiency", "tpu"),
        2 * 4096 * (48 * 128 + 32 * 128 + 2 * 16384),
    )
    again = 4 * 8 * 4096 * layer  # layers x tokens x the recomputed forward FLOPs
    assert full.time.matmul - none.time.matmul == pytest.approx(again / (PEAK * k))
    attention = 4 * 8 * 4096 * op_flops(LONG)["attention_out"]
    assert full.recompute_flops == pytest.approx(again + attention)  # estimate's count agrees
    assert full.time.attention == pytest.approx(none.time.attention * (4 + 4 + 14) / (4 + 14))
    # no checkpoint keeps every residual, each copied into the layer scan's stacks and out
    assert none.time.memory_bound > full.time.memory_bound
    # cuDNN's kernels at the H100's measured share of its peak (configs/hardware.toml); an
    # A100, whose shares were never measured, at the calibrated efficiency
    pairs, none_ = 4 * 4096 * 4097 / 2, TrainSpec(global_batch=64, remat="none")  # 4 rows a GPU
    h100 = estimate(plan("gpu-p5.48xlarge-16"), LONG, none_)
    assert h100.time.attention == pytest.approx(4 * pairs * 32 * 128 * (4 + 10) / (989e12 * 0.49))
    a100 = estimate(plan("gpu-p4de.24xlarge-16"), LONG, none_)
    k = calibration("compute_efficiency", "gpu")
    assert a100.time.attention == pytest.approx(4 * pairs * 32 * 128 * (4 + 10) / (312e12 * k))


def test_a_chip_with_measured_shares_prices_its_matmuls_at_them() -> None:
    """The H100's matmuls at 0.69 of its peak whatever the efficiency passed; without the
    shares (as an unmeasured GPU) at the efficiency."""
    parts = (
        LONG,
        TrainSpec(global_batch=64, remat="none"),
        *plan_parts(plan("gpu-a3-highgpu-8g-16")),
    )
    at = [estimate_parts(*parts, compute_efficiency=k).time.matmul for k in (0.4, 0.8)]
    assert at[0] == pytest.approx(at[1])
    bare = replace(parts[-1], matmul_share=None, attention_share=None, memory_share=None)
    plain = [estimate_parts(*parts[:-1], bare, compute_efficiency=k).time for k in (0.4, 0.8)]
    assert plain[0].matmul == pytest.approx(2 * plain[1].matmul)
    assert at[0] == pytest.approx(plain[0].matmul * 0.4 / 0.69)


@pytest.mark.parametrize(
    ("remat", "again"),
    [  # the ops the backward pass runs again (jaxprs of the reference step's gradient; the
        # attention kernel's forward in every checkpointed layer: compiled, test_compile_gpu)
        ("full", ("query", "key", "value", "attention_out", "out_proj", "mlp_in")),
        ("offload", ("query", "key", "value", "attention_out", "out_proj", "mlp_in")),
        ("dots", ("attention_out",)),
        ("dots_attention", ("attention_out",)),
        # the down projection alone placed to recompute: no projection to run again
        (dict.fromkeys(TENSORS, "device") | {"mlp_out": "recompute"}, ("attention_out",)),
        ("none", ()),
    ],
)
def test_recompute_follows_what_the_backward_pass_reads(remat, again) -> None:
    tokens, ops = 8 * 4096, op_flops(LONG)
    none = estimate(plan("tpu-v5p-16"), LONG, TrainSpec(global_batch=64, remat="none"))
    e = estimate(plan("tpu-v5p-16"), LONG, TrainSpec(global_batch=64, remat=remat))
    assert e.recompute_flops == pytest.approx(4 * tokens * sum(ops[t] for t in again))
    assert e.flops - none.flops == pytest.approx(e.recompute_flops)
    k = calibration("compute_efficiency", "tpu")
    projections = sum(ops[t] for t in again if t != "attention_out")
    assert e.time.matmul - none.time.matmul == pytest.approx(4 * tokens * projections / (PEAK * k))


def test_a_thin_matmul_reads_its_weights_at_hbm_speed() -> None:
    short = ModelSpec(**{**vars(LONG), "name": "short", "seq_len": 16})
    e = estimate(plan("tpu-v5p-16"), short, TrainSpec(global_batch=8, remat="none"))
    k = calibration("compute_efficiency", "tpu")
    flops_only = e.flops / (PEAK * k)
    assert e.time.matmul > 5 * flops_only  # 16 tokens a device: the weights dominate
    weights = 2 * (4 * (4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 16384) + 4096 * 32768)
    assert e.time.matmul > 3 * weights / HBM  # each read forward and twice backward


def test_collectives_across_granules_are_exposed() -> None:
    train = TrainSpec(global_batch=256, remat="full")
    one = estimate(plan("tpu-v5litepod-256"), ModelSpec.from_name("llama3-8b"), train)
    two = estimate(plan("tpu-v5litepod-128-2"), ModelSpec.from_name("llama3-8b"), train)
    assert one.time.across_granules == 0
    assert two.time.across_granules == pytest.approx(two.axes["data"].dcn_seconds)
    assert two.time.across_granules > 0
    t = two.time
    assert two.step_seconds == pytest.approx(
        max(t.compute, t.hidden) + t.exposed + t.across_granules + t.offload
    )


def test_the_calibration_is_a_named_fit_that_an_estimate_can_replace() -> None:
    p = plan("tpu-v5p-16")
    parts = plan_parts(p)
    train = TrainSpec(global_batch=64, remat="none")
    base = estimate_parts(LONG, train, *parts)
    assert base.step_seconds == estimate(p, LONG, train).step_seconds
    faster = estimate_parts(LONG, train, *parts, compute_efficiency=1.0)
    k = calibration("compute_efficiency", "tpu")
    assert faster.time.matmul == pytest.approx(base.time.matmul * k)
    assert faster.time.memory_bound == base.time.memory_bound  # bytes are not calibrated
    assert 0 < k < 1 and 0 < calibration("compute_efficiency", "gpu") < 1


def test_an_axis_over_ici_and_dcn_sends_its_ici_share_across_granules() -> None:
    """FSDP over 128 chips in each of 2 slices: across slices each device exchanges only its
    1/128 share of a gathered buffer with its twin in the other slice (the compilers gather
    inside the slice after), so the DCN phase moves bytes / ici / dcn per peer."""
    from loadax_mesh import HybridMeshShape
    from loadax_mesh.hardware.profile import hardware_profile

    hardware = "tpu-v5litepod-128-2"
    shape = HybridMeshShape((1, 128), (1, 2))
    config = MeshConfig(mesh_shape=shape, mesh_axis_names=("data", "fsdp"))
    p = config.plan(simulate_devices(hardware), selector=hardware)
    e = estimate(p, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=256))
    fsdp, facts = e.axes["fsdp"], hardware_profile(hardware).facts()
    assert (fsdp.ici, fsdp.dcn) == (128, 2)
    moved = sum(
        c.count * (2 if c.kind == "all-reduce" else 1) * c.bytes / 128 / 2 for c in fsdp.collectives
    )
    runs = sum(c.count * (2 if c.kind == "all-reduce" else 1) for c in fsdp.collectives)
    expected = moved / facts.dcn_bandwidth + runs * calibration("dcn_latency", "tpu")
    assert fsdp.dcn_seconds == pytest.approx(expected)
    assert e.time.across_granules == pytest.approx(fsdp.dcn_seconds)


def test_data_parallel_gradients_cross_slices_one_weight_array_at_a_time() -> None:
    """Data parallel over 4 slices of fsdp 8 (MaxText's multislice runs): each layer's 8
    weight arrays (q, k, v, o, SwiGLU's three, the norms' scales together) and the two tables
    with the final norm cross slices one all-reduce each, every one a ring of 2 x 3 steps at
    the calibrated latency; the bytes are the device's bf16 gradient shard, (4 - 1) / 4 of it
    each way over its share of the host's network."""
    from loadax_mesh.hardware.profile import hardware_profile

    hardware = "tpu-v5litepod-8-4"
    p = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    assert (p.shape["data"], p.shape["fsdp"]) == (4, 8)
    model = ModelSpec.from_name("llama3-8b")
    e = estimate(p, model, TrainSpec(global_batch=32))
    data, facts = e.axes["data"], hardware_profile(hardware).facts()
    runs = 32 * 8 + 3
    shard = model.num_params // 8 * 2
    assert sum(c.count for c in data.collectives) == runs
    assert sum(c.bytes * c.count for c in data.collectives) == pytest.approx(shard, rel=1e-6)
    latency = calibration("dcn_latency", "tpu")
    expected = 2 * 3 / 4 * shard / facts.dcn_bandwidth + runs * 2 * 3 * latency
    assert data.dcn_seconds == pytest.approx(expected, rel=1e-6)
    assert e.time.across_granules == pytest.approx(data.dcn_seconds)


def test_a_two_matrix_tied_model_with_wide_heads_counted_by_hand() -> None:
    """MaxText's 2023 shape at LONG's size: ReLU two-matrix MLP (one input matmul, no gate),
    multi-head attention with q width 2 x d_model, one embedding table."""
    wide = replace(LONG, num_kv_heads=32, head_dim=256, tied_embeddings=True, mlp="relu")
    gated = replace(wide, mlp="swiglu")
    train = TrainSpec(global_batch=64, remat="none")
    e, swiglu = (estimate(plan("tpu-v5p-16"), m, train) for m in (wide, gated))
    k = calibration("compute_efficiency", "tpu")
    d, f, h, hd, L, V = 4096, 16384, 32, 256, 4, 32768
    tokens = 8 * 4096  # 8 rows a device
    layer = 2 * d * (h + 2 * h) * hd + 2 * h * hd * d + 2 * 2 * d * f  # up and down only
    assert e.time.matmul == pytest.approx(3 * tokens * (L * layer + 2 * d * V) / (PEAK * k))
    assert (op_flops(wide)["mlp_in"], op_flops(gated)["mlp_in"]) == (2 * d * f, 4 * d * f)
    # The activation a token: ReLU reads up and writes its output, then reads up's sign and the
    # output's gradient and writes up's (5 d_ff); SwiGLU 3 + 5. The gate's weights: Adam's 28
    # bytes each (float32 parameter, gradient and moments) over the 8 shards. What each layer
    # keeps (its stacked residuals, the memory model's "activations") is copied in and out.
    activation = tokens * L * (8 - 5) * f * 2
    update = L * d * f / 8 * 28
    stacks = 4 * (swiglu.terms["activations"] - e.terms["activations"])
    gap = (swiglu.time.memory_bound - e.time.memory_bound) * HBM
    assert gap == pytest.approx(activation + update + stacks)
    # One table: the step's parameters hold it once, the head's matmul reads it as its weights.
    assert gated.num_params - wide.num_params == L * d * f
    assert e.terms["params"] < swiglu.terms["params"]
    # Across slices the untied step holds both tables and both gradients for the reduction
    # over DCN; the tied one its one table and its gradient.
    two = plan("tpu-v5p-16-2")
    tied, untied = (
        estimate(two, m, replace(train, global_batch=128)).terms
        for m in (wide, replace(wide, tied_embeddings=False))
    )
    both = untied["embeddings"] + untied["held tables"]
    assert both == 2 * (tied["embeddings"] + tied["held tables"]) == 4 * V * d * 2


def test_a_head_narrower_than_the_matrix_unit_leaves_it_idle() -> None:
    """Attention's matmuls all carry head_dim (contraction or output): on v6e's 256 x 256 MXU
    (catalogue) a 128-wide head fills half of it, on v5p's 128 x 128 all of it."""
    narrow = ModelSpec(**{**vars(LONG), "name": "narrow"})  # 32 heads of 128
    wide = ModelSpec(**{**vars(LONG), "name": "wide", "num_heads": 16, "head_dim": 256})
    train = TrainSpec(global_batch=64, remat="none")
    for hardware, ratio in (("tpu-v5p-16", 1.0), ("tpu-v6e-8", 2.0)):
        p = plan(hardware)
        a, b = (estimate(p, m, train).time.attention for m in (narrow, wide))
        assert a == pytest.approx(ratio * b), hardware  # the same FLOPs, in half-empty tiles


def test_a_chip_whose_compute_outruns_its_memory_reaches_less_of_its_peak() -> None:
    """The calibrated tile intensity (FLOPs per HBM byte) against each chip's balance: v6e
    (918 TFLOP/s over 1638 GB/s, 560 FLOPs a byte) waits on HBM, v5p (166) does not."""
    from loadax_mesh.cost.calibration import matmul_intensity

    intensity = matmul_intensity("tpu")
    assert intensity is not None and 166 < intensity < 918e12 / 1638e9
    assert matmul_intensity("gpu") is None
    train = TrainSpec(global_batch=64, remat="none")
    for hardware, fed in (("tpu-v5p-16", 1.0), ("tpu-v6e-8", intensity * 1638e9 / 918e12)):
        p = plan(hardware)
        parts = plan_parts(p)
        limited = estimate_parts(LONG, train, *parts)
        free = estimate_parts(LONG, train, *parts, intensity=float("inf"))
        assert limited.time.matmul == pytest.approx(free.time.matmul / fed), hardware


def test_a_large_slice_shares_what_it_sends_across_slices() -> None:
    """Data parallel over 2 slices of 1,024 v5p chips: a chip's catalogued 6.25 GB/s across
    slices exceeds its share of what the slice sends in all (the calibrated
    dcn_slice_bandwidth over 1,024 chips), so the gradient shard crosses at that share."""
    from loadax_mesh.cost.calibration import dcn_slice_bandwidth

    hardware = "tpu-v5p-2048-2"
    p = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    model = ModelSpec.from_name("llama3-70b")
    e = estimate(p, model, TrainSpec(global_batch=2048))
    data = e.axes["data"]
    assert (data.ici, data.dcn) == (1, 2)
    share = (dcn_slice_bandwidth("tpu") or 0.0) / 1024
    assert 0 < share < 6.25e9
    moved = sum(c.bytes * c.count for c in data.collectives)  # an all-reduce: (2 - 1) / 2, twice
    runs = sum(c.count for c in data.collectives)
    expected = moved / share + runs * 2 * calibration("dcn_latency", "tpu")
    assert data.dcn_seconds == pytest.approx(expected, rel=1e-6)


def test_a_kept_tensor_is_copied_into_its_stack_and_out() -> None:
    """Keeping the MLP's input projections (gate and up, bf16 [8 rows x 4096, 16384] each on a
    device) adds 4 accesses of their bytes a layer at HBM speed, and their recompute goes."""
    full = {t: "recompute" for t in TENSORS} | {"layer_input": "device"}
    kept = full | {"mlp_in": "device"}
    a, b = (
        estimate(plan("tpu-v5p-16"), LONG, TrainSpec(global_batch=64, remat=r)).time
        for r in (full, kept)
    )
    gate_up = 2 * 8 * 4096 * 16384 * 2
    assert b.memory_bound - a.memory_bound == pytest.approx(4 * 4 * gate_up / HBM)
    assert b.matmul < a.matmul
