"""The cost model's latent-attention terms: DeepSeek-V3's projections' FLOPs against its
parameters, the weights a device gathers over a tensor axis against the layout, the saved
value and the gathered keys and values at the value's own width, and choose_mesh's answer for
DeepSeek-V3 on a v5p pod (meshes whose weights alone do not fit skipped)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.choose.recipes import fitting_recipes
from loadax_mesh.cost.parts.flops import op_flops
from loadax_mesh.cost.parts.mla import attention_weights
from loadax_mesh.cost.parts.traffic import collectives
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import param_shapes, roles
from tests.helpers import weights_floor

DS = ModelSpec.from_name("deepseek-v3")
# A dense MLA model every dim of which is a whole number of TPU tiles: 8 heads of 128 + 64,
# values of 128, ranks 256 and 128.
SMALL = ModelSpec(
    name="small-mla", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=8,
    head_dim=192, vocab_size=1024, seq_len=256, attention="mla", q_lora_rank=256,
    kv_lora_rank=128, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
)  # fmt: skip


def test_projection_flops_are_two_per_attention_weight_and_attention_uses_both_head_dims():
    ops = op_flops(DS)
    norms = DS.q_lora_rank + DS.kv_lora_rank  # weights no matmul multiplies by
    projections = ops["query"] + ops["key"] + ops["value"] + ops["out_proj"]
    assert projections == 2 * (DS.attention_params - norms)
    # causal: half of 2 * seq * heads * (192 + 128): the scores and the weighted values
    assert ops["attention_out"] == 4096 * 128 * (192 + 128)
    full_rank = replace(DS, q_lora_rank=0)
    assert op_flops(full_rank)["query"] == 2 * 7168 * 128 * 192


def test_gathered_attention_weights_follow_the_layout_over_a_tensor_axis():
    """The bottlenecks' projections and norms stay whole on each device of the tensor axis,
    the heads' projections are cut over it: the layout's shards say the same."""
    for model in (DS, replace(DS, q_lora_rank=0), SMALL):
        for m in (1, 2, 4):
            r = roles((("data", 1), ("model", m)), ("data",))
            local = 0
            for name, (shape, logical) in param_shapes(model).items():
                if name.startswith("layers/") and name.split("/")[1] not in (
                    "attn_norm", "mlp_norm", "w_gate", "w_up", "w_down",
                ):  # fmt: skip
                    local += math.prod(shape[1:]) // r.shards(logical[1:])
            assert attention_weights(model, m) == local, (model.name, m)


def test_saved_value_and_gathered_keys_and_values_have_their_own_widths():
    devices = simulate_devices("tpu-v5p-16")
    fsdp = MeshConfig.from_preset("fsdp").plan(devices)
    train = TrainSpec(global_batch=8, remat={"value": "device"})
    saved_v = estimate(fsdp, SMALL, train).terms["activations"]
    saved_none = estimate(fsdp, SMALL, TrainSpec(global_batch=8)).terms["activations"]
    tokens = 256  # a device's one row of 256 tokens
    assert saved_v - saved_none == SMALL.num_layers * tokens * 8 * 128 * 2
    seq = MeshConfig((4, 2), ("fsdp", "seq"), batch_axis_names=("fsdp",)).plan(devices[:8])
    r = roles(tuple(seq.shape.items()), ("fsdp",))
    kv = [
        c for c in collectives(SMALL, TrainSpec(global_batch=4), r) if c.what == "keys and values"
    ]
    assert kv[0].bytes == 256 * 8 * (192 + 128) * 2  # one row's whole sequence, k and v


def test_a_tensor_axis_reduces_the_bottlenecks_gradients():
    r = roles((("fsdp", 4), ("model", 2)), ("fsdp",))
    found = {c.what: c for c in collectives(SMALL, TrainSpec(global_batch=4), r)}
    latent = found["latent gradients"]
    assert (latent.axis, latent.kind, latent.count) == ("model", "all-reduce", SMALL.num_layers)
    assert latent.bytes == 256 * (256 + 128) * 2
    gqa = replace(SMALL, attention="gqa", head_dim=128, q_lora_rank=0, kv_lora_rank=0,
                  qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)  # fmt: skip
    assert "latent gradients" not in {
        c.what for c in collectives(gqa, TrainSpec(global_batch=4), r)
    }


def test_no_checkpoint_keeps_more_than_full_remat():
    fsdp = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    kept = {
        remat: estimate(fsdp, SMALL, TrainSpec(global_batch=8, remat=remat)).terms["activations"]
        for remat in ("full", "dots", "none")
    }
    assert kept["full"] < kept["dots"] < kept["none"]


@pytest.mark.slow
def test_deepseek_v3_on_a_v5p_pod_is_planned_and_fits():
    best = choose_mesh("tpu-v5p-1024", "deepseek-v3", TrainSpec(global_batch=3072))[0]
    assert best.estimate.fits
    assert best.plan.devices.size == 512
    assert best.estimate.memory_bytes <= best.estimate.hbm_bytes
    # The published recipe's mesh, fsdp 512, is one it can plan: the 256 experts' d_model is
    # sharded over it (they do not divide over 512).
    fsdp = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-1024"))
    assert fsdp.shape == {"data": 1, "fsdp": 512}
    assert estimate(fsdp, DS, TrainSpec(global_batch=3072, remat="offload")).fits


@pytest.mark.slow
def test_meshes_whose_weights_alone_do_not_fit_are_skipped_and_priced_for_the_message():
    """Most meshes of a large MoE hold more parameters, optimizer state and gradients than the
    device has (data axes replicate them): the search skips their recipes, and prices them only
    when no mesh fits, for the message's smallest need."""
    facts = hardware_profile("tpu-v5p-128").facts()
    train = TrainSpec(global_batch=64)
    r = roles((("data", 8), ("fsdp", 8)), ("data", "fsdp"))
    assert weights_floor(DS, train, r, facts) > facts.hbm_bytes
    assert fitting_recipes(DS, train, [{}], r, facts, False, 0.1) == ([], None)
    recipes, least = fitting_recipes(DS, train, [{}], r, facts, False, 0.1, floor=False)
    assert recipes == [] and least >= weights_floor(DS, train, r, facts)
    with pytest.raises(MeshConfigError, match=r"fits no mesh .* the smallest needs"):
        choose_mesh("tpu-v5p-128", "deepseek-v3", train)
