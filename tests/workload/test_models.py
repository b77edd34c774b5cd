"""Model shapes beyond the dense Llama: experts, latent attention, two-matrix MLPs, tied
embeddings, heads wider than d_model; their parameter counts against what their publishers
state; the reference step training the dense ones; and the refusal of the reference step, the
cost model and the MaxText export to build what they do not model yet."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import check_fit, param_shapes, roles

from .losses import sharded_and_single_losses

B = 1e9

# What each model's publisher states: (total, active) parameters, as written (their rounding).
PUBLISHED = {
    # https://mistral.ai/news/mixtral-of-experts
    "mixtral-8x7b": ("46.7", "12.9"),
    # https://mistral.ai/news/mixtral-8x22b
    "mixtral-8x22b": ("141", "39"),
    # https://huggingface.co/Qwen/Qwen3-235B-A22B (model card)
    "qwen3-235b-a22b": ("235", "22"),
    # arXiv:2412.19437 (the 671B leaves out the 14B multi-token-prediction module)
    "deepseek-v3": ("671", "37"),
    # meta-llama/llama-models models/llama4/MODEL_CARD.md
    "llama4-scout-17b-16e": ("109", "17"),
    "llama4-maverick-17b-128e": ("400", "17"),
}

# Llama 4's vision encoder and projector, inside Meta's totals, outside the text decoder the
# catalogue describes. Shapes from MaxText (src/maxtext/models/llama4.py, configs/base.yml and
# models/llama4-17b-*.yml @e591f30): 34 ViT layers of width 1408 (q/k/v/o and a 5632-wide MLP,
# all with biases; two LayerNorms), a 14x14x3 patch projection, a class embedding and 577
# position embeddings, two more LayerNorms, the pixel-shuffle MLP (5632 -> 4096 -> 4096) and
# the projector (4096 -> 5120, the text width).
_VIT_LAYER = 4 * (1408 * 1408 + 1408) + (1408 * 5632 + 5632) + (5632 * 1408 + 1408) + 4 * 1408
LLAMA4_VISION = (
    34 * _VIT_LAYER
    + 3 * 14 * 14 * 1408
    + 1408
    + 577 * 1408
    + 4 * 1408
    + 5632 * 4096
    + 4096 * 4096
    + 4096 * 5120
)


def matches(count: float, published: str) -> bool:
    """Within 1% of the published figure (billions), or within its rounding where that is
    coarser ("17" stands for 16.5 to 17.5)."""
    value = float(published)
    decimals = len(published.partition(".")[2])
    return abs(count / B - value) <= max(0.01 * value, 0.5 * 10**-decimals)


def test_the_moe_catalogue_matches_its_model_cards():
    for name, (total, active) in PUBLISHED.items():
        model = ModelSpec.from_name(name)
        assert model.source and model.num_experts > 0, name
        counted_total, counted_active = model.num_params, model.num_active_params
        if name.startswith("llama4"):  # Meta's totals count the vision encoder too
            assert 0.8 * B < LLAMA4_VISION < 0.9 * B
            counted_total += LLAMA4_VISION
        if name == "deepseek-v3":
            # DeepSeek's 37B leaves out the input embedding table (a token reads one row of it):
            # counted with it, 37.55B is more than "37" stands for.
            assert not matches(counted_active, active), counted_active
            counted_active -= model.vocab_size * model.d_model
        assert matches(counted_total, total), (name, counted_total)
        assert matches(counted_active, active), (name, counted_active)
    qwen = ModelSpec.from_name("qwen3-235b-a22b")  # its card: 234B without the embeddings
    assert matches(qwen.num_params - 2 * qwen.vocab_size * qwen.d_model, "234")
    # Mistral's figures are stated to a tenth of a billion: both counts within 0.1%
    mixtral = ModelSpec.from_name("mixtral-8x7b")
    assert abs(mixtral.num_params / 46.7e9 - 1) < 1e-3
    assert abs(mixtral.num_active_params / 12.9e9 - 1) < 2e-3


def test_maxtext_2023_models_follow_its_scaling_rule_and_names():
    """MaxText's 2023 base (emb 2560, 8 heads of 256, mlp 8192, 16 layers) scaled by its
    get_individual_scales (MaxText/pyconfig.py @76bd53b0f); names are its nominal sizes."""

    def scaled(scale: int) -> tuple[int, int, int, int]:
        base, rem = divmod(int(math.log2(scale)), 3)
        heads, emb = base + (rem > 0), base + (rem > 1)
        return 2560 << emb, 8 << heads, 8192 << heads, 16 << base

    explicit = {22: (6144, 24, 24576, 48), 52: (12288, 32, 49152, 32)}  # v4/22b.sh, v4/52b.sh
    sizes = {s: scaled(s) for s in (16, 32, 64, 128, 256, 512, 1024)} | explicit
    for size, (d, heads, f, layers) in sizes.items():
        m = ModelSpec.from_name(f"maxtext-2023-{size}b")
        assert (m.d_model, m.num_heads, m.d_ff, m.num_layers) == (d, heads, f, layers), size
        assert (m.head_dim, m.num_kv_heads, m.vocab_size, m.seq_len) == (256, heads, 32768, 2048)
        assert m.mlp == "relu" and m.tied_embeddings and m.parallel_block, size
        assert abs(m.num_params / (size * B) - 1) < 0.02, (size, m.num_params)
        assert m.num_active_params == m.num_params
    gpt3 = ModelSpec.from_name("gpt3-175b")  # arXiv:2005.14165, Table 2.1: 175.0B
    assert gpt3.mlp == "gelu" and gpt3.tied_embeddings
    assert abs(gpt3.num_params / 175.0e9 - 1) < 0.01


def test_counts_term_by_term():
    """A small model of every kind, its weights spelled out."""
    d, v = 64, 100
    embeddings, final_norm, norms = 2 * v * d, d, 2 * d
    gqa = d * 16 * (4 + 4 + 2 + 2)
    dense = ModelSpec("m", 4, d, 96, 4, 2, 16, v, 128)
    assert dense.num_params == embeddings + final_norm + 4 * (norms + gqa + 3 * d * 96)
    assert replace(dense, tied_embeddings=True).num_params == dense.num_params - v * d
    relu = replace(dense, mlp="relu")
    assert relu.num_params == dense.num_params - 4 * d * 96
    assert relu.num_active_params == relu.num_params
    # 6 layers: 1 dense, then every 2nd of the other 5 a MoE layer (2 of them), 4 dense in all
    moe = replace(
        dense,
        num_layers=6,
        num_experts=8,
        experts_per_token=2,
        moe_d_ff=32,
        num_shared_experts=1,
        first_dense_layers=1,
        moe_every=2,
        router="sigmoid",
    )
    expert, router = 3 * d * 32, d * 8
    dense_layer = norms + gqa + 3 * d * 96
    assert moe.num_moe_layers == 2
    assert moe.num_params == embeddings + final_norm + 4 * dense_layer + 2 * (
        norms + gqa + router + 9 * expert
    )
    assert moe.num_params - moe.num_active_params == 2 * 6 * expert
    mla = replace(
        dense,
        attention="mla",
        num_kv_heads=4,
        head_dim=24,
        q_lora_rank=16,
        kv_lora_rank=8,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=12,
    )
    query = d * 16 + 16 + 16 * 4 * 24  # down, its norm, up to 4 heads of 16 + 8
    kv = d * (8 + 8) + 8 + 8 * 4 * (16 + 12)  # down to the latent and the rope key, norm, up
    out = 4 * 12 * d
    assert mla.attention_params == query + kv + out
    full_rank = replace(mla, q_lora_rank=0)
    assert full_rank.attention_params == d * 4 * 24 + kv + out
    # num_heads * head_dim need not be d_model (here 5 * 16 = 80 against 64)
    assert ModelSpec("m", 2, d, 96, 5, 5, 16, v, 128).attention_params == d * 16 * 20


GOOD = dict(name="m", num_layers=4, d_model=64, d_ff=96, num_heads=4, num_kv_heads=2)
MOE = dict(num_experts=4, experts_per_token=2, moe_d_ff=32)
MLA = dict(
    attention="mla",
    num_kv_heads=4,
    head_dim=24,
    kv_lora_rank=8,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mlp": "geglu"}, "mlp='geglu'; accepted: swiglu, relu, gelu"),
        ({"router": "topk"}, "router='topk'; accepted: softmax, sigmoid"),
        ({"attention": "mqa"}, "attention='mqa'; accepted: gqa, mla"),
        ({"num_experts": -1}, "num_experts=-1; accepted: a non-negative integer"),
        ({"num_experts": True, "experts_per_token": 1}, "num_experts=True"),
        ({"experts_per_token": 2}, "experts_per_token=2 with num_experts=0 \\(a dense model"),
        ({"router": "sigmoid"}, "router='sigmoid' with num_experts=0"),
        ({"routed_scaling": 2.5}, "routed_scaling=2.5 with num_experts=0 .*accepted: 1.0, or"),
        ({**MOE, "routed_scaling": 0.0}, "routed_scaling=0.0; accepted: a positive finite"),
        ({**MOE, "routed_scaling": True}, "routed_scaling=True; accepted: a positive finite"),
        ({**MOE, "experts_per_token": 5}, "experts_per_token=5 with num_experts=4; accepted: 1 to"),
        ({**MOE, "experts_per_token": 0}, "experts_per_token=0 with num_experts=4"),
        ({**MOE, "moe_d_ff": 0}, "moe_d_ff=0 with num_experts=4; accepted: a positive integer"),
        ({**MOE, "moe_every": 0}, "moe_every=0 with num_experts=4"),
        ({**MOE, "first_dense_layers": 3, "moe_every": 2}, "leave no MoE layer of num_layers=4"),
        ({"kv_lora_rank": 8}, "kv_lora_rank=8 with attention='gqa'; accepted: 0, or"),
        ({**MLA, "kv_lora_rank": 0}, "kv_lora_rank=0 with attention='mla'"),
        ({**MLA, "v_head_dim": 0}, "v_head_dim=0 with attention='mla'"),
        ({**MLA, "head_dim": 16}, "head_dim=16 with attention='mla'; accepted: .* = 24"),
        ({**MLA, "num_kv_heads": 2}, "num_kv_heads=2 with attention='mla'"),
        (
            {**MLA, "qk_rope_head_dim": 7, "qk_nope_head_dim": 17},
            "qk_rope_head_dim=7 with attention='mla'; accepted: an even number",
        ),
    ],
)
def test_bad_model_shapes(change, message):
    fields = {"head_dim": 16, "vocab_size": 100, "seq_len": 128, **GOOD, **change}
    with pytest.raises(MeshConfigError, match=message):
        ModelSpec(**fields)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"moe": "dropping"}, "moe='dropping'; accepted: dropless, capacity"),
        ({"routing": "random"}, "routing='random'; accepted: learned, balanced"),
        ({"capacity_factor": 0.0}, "capacity_factor=0.0; accepted: a positive finite number"),
        ({"capacity_factor": -1}, "capacity_factor=-1"),
        ({"capacity_factor": float("nan")}, "capacity_factor=nan"),
        ({"capacity_factor": "1.25"}, "capacity_factor='1.25'"),
        ({"capacity_factor": True}, "capacity_factor=True"),
    ],
)
def test_bad_moe_train_specs(kwargs, message):
    with pytest.raises(MeshConfigError, match=message):
        TrainSpec(global_batch=8, **kwargs)


def test_train_spec_moe_defaults():
    train = TrainSpec(global_batch=8)
    assert (train.moe, train.capacity_factor, train.routing) == ("dropless", 1.25, "learned")
    assert TrainSpec(global_batch=8, moe="capacity", capacity_factor=2).capacity_factor == 2


def test_latent_attention_is_built_and_priced_and_refused_by_the_maxtext_export():
    """The step and the cost model build multi-head latent attention (tests/workload/
    test_mla.py, tests/cost/test_mla_cost.py); the MaxText export spells it only as MaxText's
    own DeepSeek-V3 (tests/export/test_maxtext.py)."""
    model = ModelSpec(**{**GOOD, **MLA, "vocab_size": 128, "seq_len": 128})
    train = TrainSpec(global_batch=512)
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5litepod-8"))
    assert estimate(plan, model, train).memory_bytes > 0
    check_fit(model, train, roles((("fsdp", 8),), ("fsdp",)))
    assert sum(math.prod(s) for s, _ in param_shapes(model).values()) == model.num_params
    refused = "attention='mla' in a model MaxText does not ship is not modelled yet"
    with pytest.raises(MeshConfigError, match=refused):
        plan.to_maxtext(train, model=model, order=False)


# MaxText's 2023 models in miniature: multi-head attention with heads twice as wide as d_model,
# tied embeddings, a two-matrix MLP; and a SwiGLU model with wide heads.
MINIATURES = {
    "relu": replace(
        ModelSpec.from_name("tiny"),
        name="tiny-2023",
        num_kv_heads=8,
        head_dim=32,
        tied_embeddings=True,
        mlp="relu",
    ),
    "gelu": replace(
        ModelSpec.from_name("tiny"), name="tiny-gelu", tied_embeddings=True, mlp="gelu"
    ),
    "swiglu": replace(ModelSpec.from_name("tiny"), name="wide", head_dim=32),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MINIATURES))
def test_two_matrix_tied_and_wide_head_models_train_on_the_reference_step(kind):
    """The step builds each model as it is (no gate in a two-matrix MLP, one table when tied,
    projections that keep heads and head_dim apart), shards it over fsdp x tensor and trains it
    to the losses of one device."""
    model = MINIATURES[kind]
    names = set(param_shapes(model))
    assert ("layers/w_gate" in names) == (kind == "swiglu")
    assert ("unembed" in names) == (not model.tied_embeddings)
    assert sum(int(np.prod(s)) for s, _ in param_shapes(model).values()) == model.num_params
    train = TrainSpec(global_batch=8, learning_rate=1e-2, compute_dtype="float32")
    sharded, single = sharded_and_single_losses(model, train)
    np.testing.assert_allclose(sharded, single, rtol=1e-5)
    assert (np.diff(sharded) < 0).all(), sharded
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    assert estimate(plan, model, TrainSpec(global_batch=8)).step_seconds > 0
