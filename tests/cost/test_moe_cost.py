"""The cost model's MoE terms: a small MoE counted by hand (expert parameters, all-to-all bytes,
expert-weight gathers, FLOPs with capacity padding), and choose_mesh over an expert axis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.memory.layer import working_bytes
from loadax_mesh.cost.parts.shapes import Shapes
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import roles

# Every dim a whole number of TPU tiles (no padding): 2 MoE layers of 8 SwiGLU experts, 2 a token.
SMALL_MOE = ModelSpec(
    name="small-moe", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=2,
    head_dim=128, vocab_size=1024, seq_len=128, num_experts=8, experts_per_token=2,
    moe_d_ff=1024,
)  # fmt: skip
L, D, F, V, S, E, K = 2, 1024, 1024, 1024, 128, 8, 2
QKVO = D * 128 * (2 * 8 + 2 * 2)


def plan(preset: str = "fsdp_ep"):
    p = MeshConfig.from_preset(preset).plan(simulate_devices("tpu-v5p-16"))
    want = {"data": 1, "fsdp": 2, "expert": 4} if preset == "fsdp_ep" else {"data": 1, "fsdp": 8}
    assert p.shape == want
    return p


def test_expert_parameters_counted_by_hand():
    e = estimate(plan(), SMALL_MOE, TrainSpec(global_batch=8))
    # The experts' dim over expert=4 and their d_model over fsdp=2; every other d_model over
    # fsdp and expert together (8); the norms replicated.
    experts = L * 3 * (E // 4) * (D // 2) * F
    others = (2 * V * D + L * (QKVO + D * E)) // 8
    norms = 2 * L * D + D
    assert e.terms["params"] == 4 * (experts + others + norms)
    assert e.terms["optimizer"] == 2 * e.terms["params"]
    # Without an expert axis the experts' d_model shards over fsdp=8: the same bytes a device,
    # but each layer gathers every expert whole (below).
    dense_only = estimate(plan("fsdp"), SMALL_MOE, TrainSpec(global_batch=8))
    assert dense_only.terms["params"] == e.terms["params"]


def test_all_to_all_bytes_counted_by_hand():
    e = estimate(plan(), SMALL_MOE, TrainSpec(global_batch=8, remat="full"))
    # A device's 128 tokens x 2 copies; per peer the most it may send, 128 x min(2, 8 / 4)
    # rows, in a buffer of 4 peers; d_model in bfloat16.
    buffer = 4 * S * min(K, E // 4) * D * 2
    ids = 4 * S * min(K, E // 4) * 4  # an int32 expert id a row
    # Per layer: dispatch and combine forward, their gradients backward, the pair recomputed
    # under full remat; the ids forward and recomputed.
    exchanges = {c.what: c for c in e.axes["expert"].collectives}
    assert exchanges["tokens and results"].bytes == buffer
    assert exchanges["tokens and results"].count == 6 * L
    assert exchanges["expert ids"].bytes == ids and exchanges["expert ids"].count == 2 * L
    assert e.axes["expert"].bytes == 6 * L * buffer + 2 * L * ids
    none = estimate(plan(), SMALL_MOE, TrainSpec(global_batch=8, remat="none"))
    assert none.axes["expert"].bytes == 4 * L * buffer + L * ids  # nothing recomputed


def test_expert_weights_gathered_over_fsdp():
    cd = 2
    with_ep = {c.what: c for c in estimate(plan(), SMALL_MOE, TrainSpec(global_batch=8)).axes[
        "fsdp"
    ].collectives}  # fmt: skip
    # With an expert axis: each device's 2 experts, d_model gathered over fsdp.
    assert with_ep["expert weights"].bytes == 3 * (E // 4) * D * F * cd
    assert with_ep["expert weights"].count == 2 * L
    # on TPU the attention block's weights are gathered in line, apart (every layer, each pass)
    assert with_ep["MoE layer weights"].bytes == D * E * cd
    assert (
        with_ep["attention weights"].bytes == QKVO * cd
        and not with_ep["attention weights"].overlaps
    )
    without = estimate(plan("fsdp"), SMALL_MOE, TrainSpec(global_batch=8, moe="capacity"))
    found = {c.what: c for c in without.axes["fsdp"].collectives}
    assert found["expert weights"].bytes == 3 * E * D * F * cd  # every expert whole
    assert "expert" not in without.axes


def test_capacity_padding_and_the_dense_weight_gradient_are_executed_work():
    def flops(**train):
        return estimate(plan(), SMALL_MOE, TrainSpec(global_batch=8, remat="none", **train))

    dropless = flops()
    even = flops(moe="capacity", capacity_factor=1.0)  # 128 x 2 / 8 = 32 slots: no padding
    padded = flops(moe="capacity", capacity_factor=2.0)
    # Dropless, the experts' weight gradients run dense over both local experts and every row
    # of the received buffer (4 peers x 128 tokens x min(2, 8 / 4)): 2 x 1024 rows, not 256
    # copies; the forward and input gradient run the grouped kernel over the copies.
    wider = 3 * 2 * D * F * (2 * 4 * 128 * 2 - S * K) * L
    assert dropless.flops - even.flops == pytest.approx(wider)
    # On GPU tokamax's kernels group all three passes: the weight gradient too runs over the
    # copies alone (the padding of the worst-case buffer in no group).
    gpu = MeshConfig.from_preset("fsdp_ep", expert=4).plan(simulate_devices("gpu-p5.48xlarge-8"))
    assert gpu.shape == {"data": 1, "fsdp": 2, "expert": 4}
    on_gpu = estimate(gpu, SMALL_MOE, TrainSpec(global_batch=8, remat="none"))
    assert on_gpu.flops - dropless.flops == pytest.approx(-wider)
    expert = 3 * 3 * 2 * S * K * D * F * L  # 3 matrices, 2 FLOPs, forward + 2 backward
    assert padded.flops - even.flops == pytest.approx(expert)
    assert padded.model_flops == even.model_flops  # the model's work is the k copies


def test_dense_layers_keep_their_terms():
    """A first dense layer is priced as a dense model's layer, the MoE layers apart."""
    mixed = replace(SMALL_MOE, num_layers=3, first_dense_layers=1)
    train = TrainSpec(global_batch=8, remat="none")
    dense = [
        replace(SMALL_MOE, num_layers=n, num_experts=0, experts_per_token=0, moe_d_ff=0)
        for n in (1, 2)
    ]
    one_layer = estimate(plan(), dense[1], train).flops - estimate(plan(), dense[0], train).flops
    moe_only = estimate(plan(), SMALL_MOE, train).flops
    assert estimate(plan(), mixed, train).flops - moe_only == pytest.approx(one_layer)


def test_choose_mesh_searches_an_expert_axis():
    ranked = choose_mesh(
        "tpu-v5p-128", "mixtral-8x7b", TrainSpec(global_batch=128), axes=("data", "fsdp", "expert")
    )
    assert ranked and all(c.estimate.fits for c in ranked)
    # meshes with experts over an expert axis are searched and priced beside fsdp alone
    assert any(c.plan.shape["expert"] > 1 for c in ranked)
    assert any(c.estimate.axes["expert"].bytes > 0 for c in ranked)


def test_expert_backward_holds_the_input_gradients_beside_narrow_experts():
    """The MoE layer's backward peaks at the larger of two points: the SwiGLU's backward (2
    d_model-wide buffers, 4 expert-wide) and the input's gradient (5 d_model-wide: the input
    rows, the output's gradient, the input's gradient through gate, through up and their sum;
    3 expert-wide). Narrow experts (DeepSeek's) peak at the second, wide ones at the first:
    widening the experts adds 3 expert-wide buffers' growth, then 4."""
    p = plan()
    r = roles(tuple(p.shape.items()), p.batch_axis_names)
    train = TrainSpec(global_batch=8, remat="full")

    def work(width: int) -> int:
        model = replace(SMALL_MOE, moe_d_ff=width)
        return working_bytes(
            model, train, Shapes.of(model, train, r), r, (8, 128), "splash", moe=True
        )

    # A device routes 1 row x 128 tokens; over expert=4 its buffer holds 4 x 128 x min(2, 2)
    # rows; an expert-wide buffer is rows x width in bfloat16, a d_model-wide one rows x 1024.
    rows = 4 * S * K
    assert work(512) - work(256) == 3 * rows * 256 * 2  # below 3 x d_model: the input's gradient
    assert work(8192) - work(4096) == 4 * rows * 4096 * 2  # above: the SwiGLU's backward


def test_the_chooser_keeps_the_users_moe_path_and_prices_the_other() -> None:
    """Which tokens train is the user's call: the default (dropless) search returns dropless
    choices only, `moe="capacity"` capacity only, both only where the recipes name both; the
    ranking prices the winner with the path it did not search."""
    model, hw = SMALL_MOE, "tpu-v5p-16"
    dropless = choose_mesh(hw, model, TrainSpec(global_batch=64))
    assert {c.train.moe for c in dropless} == {"dropless"}
    assert next(w for w, _ in dropless.numerics) == "moe capacity"
    capacity = choose_mesh(hw, model, TrainSpec(global_batch=64, moe="capacity"))
    assert {c.train.moe for c in capacity} == {"capacity"}
    both = choose_mesh(
        hw, model, TrainSpec(global_batch=64), recipes=[{"moe": "dropless"}, {"moe": "capacity"}]
    )
    assert not any(w.startswith("moe") for w, _ in both.numerics)
    assert both[0].estimate.step_seconds <= min(dropless[0].estimate.step_seconds,
                                                capacity[0].estimate.step_seconds)  # fmt: skip
