"""The cost model: a small case counted by hand, choosing, and bad input. No jax needed."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec

# Every dim a whole number of TPU tiles (minor dims multiples of 128), so no padding.
SMALL = ModelSpec(
    name="small", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=2,
    head_dim=128, vocab_size=1024, seq_len=128,
)  # fmt: skip
TPU, GPU = (hardware_profile(h).facts() for h in ("tpu-v5p-16", "gpu-p5.48xlarge-8"))


def small_estimate(remat="full"):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    assert plan.shape == {"data": 1, "fsdp": 8}
    return estimate(plan, SMALL, TrainSpec(global_batch=8, remat=remat))


def test_memory_counted_by_hand():
    e = small_estimate()
    L, D, F, V, S, cd = 2, 1024, 1024, 1024, 128, 2
    qkvo = D * 128 * (2 * 8 + 2 * 2)
    layer_weights = qkvo + 3 * D * F  # one layer, norms aside
    sharded = 2 * V * D + L * layer_weights  # every weight shards its d_model over fsdp=8
    replicated = 2 * L * D + D  # the norms
    per_device = sharded // 8 + replicated
    tokens = 1 * S  # one sequence per device
    assert e.terms["params"] == 4 * per_device
    assert e.terms["optimizer"] == 2 * 4 * per_device
    assert e.terms["gradients"] == 4 * per_device
    assert e.terms["batch"] == 2 * 4 * tokens
    assert e.terms["activations"] == L * tokens * D * cd  # full remat: each layer's input
    assert e.terms["logits"] == 2 * tokens * V * cd  # and their gradient
    assert e.terms["embeddings"] == 2 * V * D * cd  # a gathered table and its gradient
    # One layer's weights gathered three times over, its intermediates recomputed and their
    # gradients: per token 5 d_model-wide tensors, q, rotated q and the attention output
    # (8 heads), k, v and rotated k (2 heads), gate, up and gated; the two norms' float32
    # inputs; the splash kernel's float32 buffers: its log-sum-exp per head and token, written
    # over 128 lanes, and six accumulators of a 128-row block by 128 lanes (running max and
    # sum, output; dq, dk, dv: head_dim 128).
    per_token = 5 * D + 3 * 8 * 128 + 3 * 2 * 128 + 3 * F
    kernel = 8 * tokens * 128 * 4 + 6 * 128 * 128 * 4
    intermediates = tokens * per_token * cd + 2 * tokens * D * 4 + kernel
    assert e.terms["layer"] == 3 * layer_weights * cd + 2 * intermediates
    always = e.terms["params"] + e.terms["optimizer"] + e.terms["batch"]
    loop = always + e.terms["activations"] + e.terms["gradients"] + e.terms["layer"]
    assert e.phases["layer loop"] == loop == e.memory_bytes == sum(e.memory.values())
    assert e.memory["logits"] == 0  # not live in the layer loop
    assert e.fits and e.hbm_bytes == int(95.74 * 2**30)


def test_collectives_and_compute_counted_by_hand():
    e = small_estimate()
    L, D, F, V, S, cd = 2, 1024, 1024, 1024, 128, 2
    layer = (D * 128 * (2 * 8 + 2 * 2) + 3 * D * F) * cd  # one layer gathered in bf16
    tables = 2 * V * D * cd
    fsdp = e.axes["fsdp"]
    kinds = {(c.kind, c.what): (c.bytes, c.count) for c in fsdp.collectives}
    assert kinds == {
        ("all-gather", "layer weights"): (layer, 2 * L),  # forward and backward
        ("reduce-scatter", "layer weight gradients"): (layer, L),
        ("all-gather", "embedding tables"): (tables, 1),
        ("reduce-scatter", "embedding gradients"): (tables, 1),
    }
    assert fsdp.bytes == 3 * L * layer + 2 * tables and fsdp.across_granules == 0
    assert e.axes["data"].bytes == 0
    # 2 FLOPs per weight per token, causal attention, 3x for the backward pass, and full
    # remat's second forward pass of the layers.
    per_layer = 2 * (D * 128 * (2 * 8 + 2 * 2) + 3 * D * F) + 2 * S * 8 * 128
    forward = S * (L * per_layer + 2 * V * D)
    assert e.flops == 3 * forward + S * L * per_layer
    t = e.time  # the terms themselves: tests/cost/test_time.py
    assert e.compute_seconds == pytest.approx(t.matmul + t.attention + t.memory_bound)
    assert e.compute_seconds > e.flops / 459e12  # below the peak
    hidden = fsdp.seconds
    assert e.step_seconds == pytest.approx(max(e.compute_seconds, hidden))
    assert e.bottleneck in ("compute", "fsdp axis 'fsdp' (ICI; hides no more)")


def test_only_tpu_splash_attention_holds_the_kernels_buffers():
    """The splash kernel's lane-wide log-sum-exp and accumulators are TPU-only; elsewhere the
    log-sum-exp is one float32 per head and token."""
    from loadax_mesh.cost.memory import memory_terms
    from loadax_mesh.workload.layout import roles

    r = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    train = TrainSpec(global_batch=8)
    tpu, gpu = (memory_terms(SMALL, train, r, device)["layer"] for device in (TPU, GPU))
    kernel = 8 * 128 * 128 * 4 + 6 * 128 * 128 * 4  # as counted by hand above
    assert tpu - gpu == 2 * (kernel - 8 * 128 * 4)  # full remat: recomputed, and gradients


def test_only_tpu_holds_a_compute_dtype_set_of_data_parallel_gradients():
    """TPU reduces the gradient shards over data after the layer loop, from a stacked bf16
    set; XLA's GPU pipeline reduces each layer's inside the loop, so data parallelism adds no
    memory there (a GPU compile of LLaMA-2 7B, 4 layers: data 2 x fsdp 8 needs no more than
    fsdp 8)."""
    from loadax_mesh.cost.memory import memory_terms
    from loadax_mesh.workload.layout import roles

    train = TrainSpec(global_batch=16)
    dp = roles([("data", 2), ("fsdp", 8)], ["data", "fsdp"])
    alone = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    tpu = memory_terms(SMALL, train, dp, TPU)
    assert tpu["reduced gradients"] == tpu["gradients"] // 2  # float32 shards, once in bf16
    assert memory_terms(SMALL, train, alone, TPU)["reduced gradients"] == 0
    assert memory_terms(SMALL, train, dp, GPU)["reduced gradients"] == 0


def test_remat_policies_order_the_memory():
    full, dots, none = (small_estimate(r).terms["activations"] for r in ("full", "dots", "none"))
    assert full < dots < none


def test_the_winner_fits_and_is_fastest():
    ranking = choose_mesh(
        "tpu-v5p-128", ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=64)
    )
    assert 1 <= len(ranking) <= 5 and ranking.planned >= len(ranking)
    assert ranking.considered > sum(ranking.pruned.values())
    steps = [c.estimate.step_seconds for c in ranking]
    assert steps == sorted(steps)
    for c in ranking:
        assert c.estimate.fits and c.estimate.memory_bytes <= 0.9 * c.estimate.hbm_bytes
        assert isinstance(c.config, MeshConfig)
        assert c.plan.shape == c.estimate.mesh
    auto = MeshConfig.from_preset(
        "auto", hardware="tpu-v5p-128", model="llama3-8b", global_batch=64
    )
    assert auto == ranking[0].config


def test_a_model_that_fits_nowhere():
    with pytest.raises(MeshConfigError, match=r"needs \d+\.\d+ GB per device, the hardware has"):
        choose_mesh("tpu-v5litepod-8", ModelSpec.from_name("llama3-70b"), TrainSpec(global_batch=8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"axes": ("data", "experts")}, "axes=\\('data', 'experts'\\)"),
        ({"axes": ("model", "seq")}, "has no batch axis"),
        ({"top": 0}, "top=0"),
        ({"headroom": 1.5}, "headroom=1.5"),
        ({"axes": 5}, "axes=5"),
        ({"axes": [["data"]]}, "axes=\\[\\['data'\\]\\]"),
    ],
)
def test_bad_choose_input(kwargs, message):
    with pytest.raises(MeshConfigError, match=message):
        choose_mesh("tpu-v5p-16", SMALL, TrainSpec(global_batch=8), **kwargs)


def test_a_batch_smaller_than_every_data_parallel_degree():
    with pytest.raises(MeshConfigError, match="global_batch=1 is smaller than"):
        choose_mesh("tpu-v5p-16", SMALL, TrainSpec(global_batch=1), axes=("data", "fsdp"))


def test_missing_catalogue_facts_are_named():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v2-32"))
    with pytest.raises(MeshConfigError, match="the catalogue has no ici bandwidth"):
        estimate(plan, SMALL, TrainSpec(global_batch=32))
    with pytest.raises(MeshConfigError, match="preset 'auto' needs hardware="):
        MeshConfig.from_preset("auto", model="tiny")


def test_choose_mesh_takes_a_model_name_and_auto_names_unknown_options():
    by_name = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16))
    by_spec = choose_mesh("tpu-v5p-16", ModelSpec.from_name("tiny"), TrainSpec(global_batch=16))
    assert [c.estimate.mesh for c in by_name] == [c.estimate.mesh for c in by_spec]
    with pytest.raises(MeshConfigError, match=r"unknown option tp=2; accepted: .*remat"):
        MeshConfig.from_preset("auto", hardware="tpu-v5p-16", model="tiny", global_batch=16, tp=2)
    auto = MeshConfig.from_preset(
        "auto", hardware="tpu-v5p-16", model="tiny", global_batch=16, remat="dots"
    )
    dots = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16, remat="dots"))
    assert auto.mesh_shape == dots[0].config.mesh_shape


def test_choosing_for_a_model_the_cost_model_does_not_price_says_so() -> None:
    with pytest.raises(MeshConfigError, match="attention='mla' is not modelled yet"):
        choose_mesh("tpu-v5p-128", "deepseek-v3", TrainSpec(global_batch=64))
