"""Low-precision matmuls in the cost model (`TrainSpec.quantization`, issue 52): the chips'
fp8 and int8 peaks read from the catalogue and refused by name where a chip has none, the
quantized step priced at the precision's peak with its casts as memory-bound work, its quantized
copies held, the conditions it rests on, and the exports' keys. No jax needed."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.calibration import quantized_entry, quantized_share
from loadax_mesh.cost.parts.quantized import quantized
from loadax_mesh.cost.parts.weights import dense_layer_weights
from loadax_mesh.export.flax_rules import flax_notes
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import roles

LLAMA = ModelSpec.from_name("llama3-8b")


def _fsdp(hardware: str, model: ModelSpec = LLAMA, *, quantization: str = "none", **options):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    facts = options.pop("facts", None)
    train = TrainSpec(global_batch=options.pop("global_batch", 16), quantization=quantization,
                      **options)  # fmt: skip
    return estimate(plan, model, train, facts=facts)


def test_the_catalogue_reads_each_chips_low_precision_peaks():
    peaks = {
        hw: (f.peak_flops, f.peak_fp8, f.peak_int8)
        for hw in ("gpu-p5.48xlarge-8", "gpu-p4d.24xlarge-8", "gpu-dgx-b200-8", "tpu-v4-8",
                   "tpu-v5litepod-8", "tpu-v5p-8", "tpu-v6e-8", "tpu-7x-8")
        for f in [hardware_profile(hw).facts()]
    }  # fmt: skip
    assert peaks["gpu-p5.48xlarge-8"] == (989e12, 1979e12, 1979e12)
    assert peaks["gpu-p4d.24xlarge-8"] == (312e12, None, 620e12)  # no fp8 on the A100
    assert peaks["gpu-dgx-b200-8"] == (2250e12, 4500e12, None)  # no int8 figure found
    assert peaks["tpu-v4-8"] == (275e12, None, 275e12)  # int8 gains nothing on v4
    assert peaks["tpu-v5litepod-8"] == (197e12, None, 394e12)
    assert peaks["tpu-v5p-8"] == (459e12, None, 918e12)
    assert peaks["tpu-v6e-8"] == (918e12, None, 1840e12)
    # TPU7x: two devices a chip, each with half of the chip's 4,614 fp8 TFLOP/s
    assert peaks["tpu-7x-8"] == (2307e12 / 2, 4614e12 / 2, None)


@pytest.mark.parametrize(
    "hardware, quantization, accepted",
    [
        ("tpu-v5p-8", "fp8", "none, int8"),
        ("tpu-v6e-8", "fp8", "none, int8"),
        ("gpu-p4d.24xlarge-8", "fp8", "none, int8"),
        ("gpu-dgx-b200-8", "int8", "none, fp8"),
    ],
)
def test_a_precision_the_chip_has_no_peak_for_is_refused_by_name(hardware, quantization, accepted):
    with pytest.raises(MeshConfigError) as err:
        _fsdp(hardware, quantization=quantization)
    text = str(err.value)
    assert f"quantization={quantization!r}" in text and f"hardware={hardware!r}" in text
    assert f"no peak_{quantization}" in text and f"accepted: {accepted}," in text
    assert f"--fact peak_{quantization}=VALUE" in text
    # the peak given for the run prices it
    given = _fsdp(hardware, quantization=quantization,
                  facts={f"peak_{quantization}": "2000 TFLOPs"})  # fmt: skip
    assert given.step_seconds > 0 and given.given == {f"peak_{quantization}": "2000 TFLOPs"}


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_fp8_on_eight_h100s_gains_what_the_published_runs_gain(remat):
    """LLaMA-3 8B over fsdp 8 at 8,192 tokens a sequence: torchtitan measured 1.28x with
    Float8 on 8 H100s; issue 52 asks for a gain between 1.1 and 1.5."""
    bf16 = _fsdp("gpu-p5.48xlarge-8", remat=remat)
    fp8 = _fsdp("gpu-p5.48xlarge-8", remat=remat, quantization="fp8")
    assert 1.1 < bf16.step_seconds / fp8.step_seconds < 1.5
    # only the projections and MLP get faster; attention is bf16, the collectives unchanged
    # (weights are gathered in the compute dtype), the casts cost memory-bound time
    assert fp8.time.matmul < bf16.time.matmul
    assert fp8.time.attention == bf16.time.attention
    assert (fp8.time.hidden, fp8.time.exposed) == (bf16.time.hidden, bf16.time.exposed)
    assert fp8.time.memory_bound > bf16.time.memory_bound
    # the optimizer state and the parameters are those of the bf16 step
    for term in ("params", "optimizer", "gradients"):
        assert fp8.terms[term] == bf16.terms[term]
    assert fp8.model_flops == bf16.model_flops and fp8.assumes == ()


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b"])
def test_int8_on_v5p_is_faster_than_bf16_and_slower_than_half(model):
    bf16 = _fsdp("tpu-v5p-128", ModelSpec.from_name(model), global_batch=64)
    int8 = _fsdp("tpu-v5p-128", ModelSpec.from_name(model), global_batch=64, quantization="int8")
    assert bf16.step_seconds / 2 < int8.step_seconds < bf16.step_seconds
    # v5p's int8 share was fitted on no TPU run: the estimate says what it is carried from
    [condition] = int8.assumes
    entry = quantized_entry("tpu", "int8")
    assert f"quantized_share {entry['value']}" in condition
    assert f"carried from the {entry['carried_from']} fit" in condition


def test_the_casts_are_counted_as_memory_bound_work():
    """Each quantized tensor read twice in bf16 (its absmax, the cast) and written once in one
    byte, at HBM bandwidth: the weights and inputs of each forward pass (twice under full
    remat: the recompute quantizes again), each matmul's output gradient once."""
    hw, shape = "gpu-p5.48xlarge-8", {"fsdp": 8}
    bf16, fp8 = _fsdp(hw, remat="full"), _fsdp(hw, remat="full", quantization="fp8")
    q = quantized(LLAMA, TrainSpec(global_batch=16, quantization="fp8"),
                  roles(tuple(shape.items()), ("fsdp",)))  # fmt: skip
    assert q.weights == dense_layer_weights(LLAMA, 1)  # every projection and MLP matrix
    casts = LLAMA.num_layers * (2 * q.forward + q.gradients) * (2 + 2 + 1)
    hbm = hardware_profile(hw).facts().hbm_bandwidth
    assert fp8.time.memory_bound - bf16.time.memory_bound == pytest.approx(casts / hbm)
    # one layer: its q, k, v read one norm, gate and up another
    t, d, f = 2 * LLAMA.seq_len, LLAMA.d_model, LLAMA.d_ff
    assert q.inputs == t * (d + LLAMA.num_heads * LLAMA.head_dim + d + f)  # 4 tensors
    q_width, kv_width = LLAMA.num_heads * LLAMA.head_dim, LLAMA.num_kv_heads * LLAMA.head_dim
    assert q.gradients == t * (q_width + 2 * kv_width + d + 2 * f + d)


def test_the_quantized_copies_are_held_in_the_layer_loop():
    bf16 = _fsdp("gpu-p5.48xlarge-8")
    fp8 = _fsdp("gpu-p5.48xlarge-8", quantization="fp8")
    assert "quantized" not in bf16.terms
    q = quantized(LLAMA, TrainSpec(global_batch=16, quantization="fp8"),
                  roles((("fsdp", 8),), ("fsdp",)))  # fmt: skip
    assert fp8.terms["quantized"] == q.weights + q.inputs + q.widest  # one byte each
    assert fp8.phases["layer loop"] - bf16.phases["layer loop"] == fp8.terms["quantized"]
    assert fp8.phases["tail"] == bf16.phases["tail"]


def test_a_measured_share_replaces_the_calibration():
    """The chip's measured share of its fp8 peak (a kernel sweep's, given here as a fact) in
    place of the calibrated ratio: equal to it, the same step; lower, a slower one."""
    own = hardware_profile("gpu-p5.48xlarge-8").facts().matmul_share
    calibrated = own * quantized_share("gpu", "fp8")
    shipped = _fsdp("gpu-p5.48xlarge-8", quantization="fp8")
    same = _fsdp("gpu-p5.48xlarge-8", quantization="fp8",
                 facts={"fp8_matmul_share": calibrated})  # fmt: skip
    assert same.step_seconds == pytest.approx(shipped.step_seconds, rel=1e-12)
    lower = _fsdp("gpu-p5.48xlarge-8", quantization="fp8", facts={"fp8_matmul_share": 0.3})
    assert lower.time.matmul > shipped.time.matmul


def test_moe_experts_are_quantized_and_the_router_is_not():
    mixtral = ModelSpec.from_name("mixtral-8x7b")
    plan = MeshConfig((8, 1), ("fsdp", "expert"), ("fsdp", "expert")).plan(
        simulate_devices("gpu-p5e.48xlarge-8"), selector="gpu-p5e.48xlarge-8"
    )
    bf16, fp8 = (
        estimate(plan, mixtral, TrainSpec(global_batch=8, quantization=q)) for q in ("none", "fp8")
    )
    assert fp8.time.matmul < 0.75 * bf16.time.matmul
    assert fp8.terms["quantized"] > 8 * 3 * mixtral.d_model * mixtral.moe_d_ff  # the experts


@pytest.mark.parametrize(
    "quantization, keys",
    [
        ("none", {}),
        ("fp8", {"quantization": "fp8_full", "use_qwix_quantization": "true"}),
        ("int8", {"quantization": "int8"}),
    ],
)
def test_the_exports_say_the_precision(quantization, keys):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-8"))
    config = plan.to_maxtext(TrainSpec(global_batch=8, quantization=quantization), order=False)
    assert {k: v for k, v in config.keys.items() if "quantization" in k} == keys
    noted = [n for n in config.notes if "quantization=" in n]
    assert len(noted) == bool(keys)
    axlearn = plan.to_axlearn(order=False, quantization=quantization).notes
    expected = [f"not exported: quantization={quantization!r}"] if keys else []
    assert [n[: len(expected[0])] for n in axlearn if n.startswith("not exported: quant")] == (
        expected
    )
    assert [n[: len(expected[0])] for n in flax_notes(quantization)] == expected


def test_the_chooser_keeps_the_users_precision_and_the_export_names_it() -> None:
    """Numerics are the user's: fp8 asked on a TPU7x string gives fp8 choices only, the ranking
    prices the winner in bf16 beside it, and MaxText's export says fp8_full."""
    r = choose_mesh(
        "tpu-7x-256",
        ModelSpec.from_name("llama3-8b"),
        TrainSpec(global_batch=256, quantization="fp8"),
    )
    assert {c.train.quantization for c in r} == {"fp8"}
    (what, bf16), *_ = r.numerics
    assert what == "quantization none" and bf16 > r[0].estimate.step_seconds
    assert r[0].plan.to_maxtext(r[0].train).keys["quantization"] == "fp8_full"
