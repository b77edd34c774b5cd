"""`ModelSpec.from_file`: Hugging Face config.json files as their publishers wrote them (the
fields of each file on the Hub, written here: no download at run time) read as the catalogue's
models; windows from each family's rule; what is not expressible or not given refused by name."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from loadax_mesh import MeshConfigError
from loadax_mesh.workload import ModelSpec
from loadax_mesh.workload.hf_config import MODEL_TYPES

# https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (no head_dim: 4096 / 32)
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (num_local_experts;
# intermediate_size is each expert's width)
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
# https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (num_experts; head_dim 128
# with 64 heads: 8192 != hidden_size)
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 94,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 1536,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 94,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (n_routed_experts, MLA)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}
# https://huggingface.co/google/gemma-3-12b-pt/blob/main/config.json: the text model's few
# fields; Gemma3TextConfig's defaults give the rest (vocab 262208, head_dim 256, 131072, tied)
GEMMA3_12B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
# https://huggingface.co/google/gemma-2-9b/blob/main/config.json (no layer_types: even layers
# slide, odd ones are global)
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}
# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (layer_types alternating)
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}
# https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (a window on every layer)
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


def write(tmp_path: Path, config: dict, name: str = "config.json", folder: str = "m") -> str:
    path = tmp_path / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    return str(path)


def shape(model: ModelSpec) -> dict:
    """Every field but those a file names for itself (name, source) and the context."""
    return {f.name: getattr(model, f.name) for f in fields(model)} | dict(
        name=None, source=None, seq_len=None
    )


@pytest.mark.parametrize(
    ("config", "folder", "catalogue", "seq_len"),
    [
        (LLAMA3_8B, "Meta-Llama-3-8B", "llama3-8b", 8192),
        (MIXTRAL_8X7B, "Mixtral-8x7B-v0.1", "mixtral-8x7b", 32768),
        (QWEN3_235B, "Qwen3-235B-A22B", "qwen3-235b-a22b", 40960),
        (DEEPSEEK_V3, "DeepSeek-V3", "deepseek-v3", 163840),
        (GEMMA3_12B, "gemma-3-12b-pt", "gemma3-12b", 131072),
        (GPT_OSS_120B, "gpt-oss-120b", "gpt-oss-120b", 131072),
    ],
)
def test_published_configs_read_as_the_catalogue_models(
    tmp_path, config, folder, catalogue, seq_len
):
    path = write(tmp_path, config, folder=folder)
    model, ours = ModelSpec.from_file(path), ModelSpec.from_name(catalogue)
    assert shape(model) == shape(ours), catalogue
    assert (model.name, model.source, model.seq_len) == (folder, path, seq_len)
    assert abs(model.num_params / ours.num_params - 1) < 3e-3
    assert abs(model.num_active_params / ours.num_active_params - 1) < 3e-3


def test_the_traps_each_family_sets(tmp_path):
    llama = ModelSpec.from_file(write(tmp_path, LLAMA3_8B))
    assert llama.head_dim == 4096 // 32 and llama.num_kv_heads == 8  # head_dim absent
    mha = ModelSpec.from_file(write(tmp_path, {**LLAMA3_8B, "num_key_value_heads": None}))
    assert mha.num_kv_heads == mha.num_heads == 32
    # DeepSeek: transformers writes head_dim = qk_rope_head_dim (64) into the configs it saves;
    # a query/key head is 128 + 64 wide, and MLA keys and values are per head
    saved = {**DEEPSEEK_V3, "head_dim": 64, "num_key_value_heads": 16}
    deepseek = ModelSpec.from_file(write(tmp_path, saved))
    assert (deepseek.head_dim, deepseek.num_kv_heads, deepseek.attention) == (192, 128, "mla")
    assert (deepseek.router, deepseek.routed_scaling, deepseek.first_dense_layers) == (
        "sigmoid",
        2.5,
        3,
    )
    full_rank = ModelSpec.from_file(write(tmp_path, {**DEEPSEEK_V3, "q_lora_rank": None}))
    d, h, q = 7168, 128 * 192, 1536  # a full-rank query projection against the rank-1536 one
    assert full_rank.attention_params - deepseek.attention_params == d * h - q * (d + 1 + h)
    # the expert count under any of its names; Qwen3's MoE layers from its two fields
    alias = {k: v for k, v in QWEN3_235B.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert ModelSpec.from_file(write(tmp_path, alias)).num_experts == 8
    for dense, step, first, every in (([0, 1], 1, 2, 1), ([], 2, 0, 2), ([0, 1], 2, 2, 2)):
        qwen = {**QWEN3_235B, "mlp_only_layers": dense, "decoder_sparse_step": step}
        model = ModelSpec.from_file(write(tmp_path, qwen))
        assert (model.first_dense_layers, model.moe_every) == (first, every)
        moe = [i for i in range(94) if i not in dense and (i + 1) % step == 0]
        assert model.num_moe_layers == len(moe)
    everything = {**QWEN3_235B, "mlp_only_layers": list(range(94))}  # no MoE layer: dense
    assert ModelSpec.from_file(write(tmp_path, everything)).num_experts == 0


def test_gemma3_multimodal_reads_as_its_text_model(tmp_path):
    model = ModelSpec.from_file(write(tmp_path, GEMMA3_12B, folder="gemma-3-12b-pt"))
    assert round(model.num_params / 1e9, 2) == 11.77  # the text decoder, no vision tower
    assert (model.head_dim, model.vocab_size, model.seq_len) == (256, 262208, 131072)
    assert model.tied_embeddings and model.mlp == "swiglu"
    assert (model.sliding_window, model.global_every, model.num_local_layers) == (1024, 6, 40)
    assert [i for i in range(48) if not model.window(i)] == list(range(5, 48, 6))
    # transformers' newer files spell the pattern as layer_types; a text model on its own
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)]
    newer = {**GEMMA3_12B["text_config"], "layer_types": layer_types}
    text_only = ModelSpec.from_file(write(tmp_path, newer, "gemma3-text.json"))
    assert shape(text_only) == shape(model) and text_only.name == "gemma3-text"
    example = Path(__file__).parents[2] / "examples/models/gemma-3-12b-pt/config.json"
    assert json.loads(example.read_text()) == GEMMA3_12B  # docs/cli.md reads it
    without = {k: v for k, v in GEMMA3_12B["text_config"].items() if k != "model_type"}
    implied = {**GEMMA3_12B, "text_config": without}  # gemma3's text config is gemma3_text
    assert shape(ModelSpec.from_file(write(tmp_path, implied))) == shape(model)


def test_windows_of_gemma2_gpt_oss_mistral_and_qwen2(tmp_path):
    gemma2 = ModelSpec.from_file(write(tmp_path, GEMMA2_9B))
    assert (gemma2.sliding_window, gemma2.global_every, gemma2.num_local_layers) == (4096, 2, 21)
    assert gemma2.window(0) == 4096 and gemma2.window(1) == 0
    assert gemma2.tied_embeddings and abs(gemma2.num_params / 9.24e9 - 1) < 3e-3
    oss = ModelSpec.from_file(write(tmp_path, GPT_OSS_120B))
    assert (oss.sliding_window, oss.global_every, oss.window(0), oss.window(1)) == (128, 2, 128, 0)
    # the model card's 116.8B total, 5.1B active without the input embedding
    assert abs(oss.num_params / 116.8e9 - 1) < 1e-3
    assert abs((oss.num_active_params - oss.vocab_size * oss.d_model) / 5.13e9 - 1) < 3e-3
    mistral = ModelSpec.from_file(write(tmp_path, MISTRAL_7B_V01))
    assert (mistral.sliding_window, mistral.global_every, mistral.num_local_layers) == (4096, 0, 32)
    assert shape(replace(mistral, sliding_window=0)) == shape(ModelSpec.from_name("mistral-7b"))
    v03 = ModelSpec.from_file(write(tmp_path, {**MISTRAL_7B_V01, "sliding_window": None}))
    assert v03.sliding_window == 0
    qwen2 = {**LLAMA3_8B, "model_type": "qwen2", "sliding_window": 4096, "max_window_layers": 0}
    assert ModelSpec.from_file(write(tmp_path, qwen2)).sliding_window == 0  # use_sliding_window
    qwen2["use_sliding_window"] = True
    assert ModelSpec.from_file(write(tmp_path, qwen2)).num_local_layers == 32
    qwen2["max_window_layers"] = 28
    with pytest.raises(MeshConfigError, match=r"layer_types make layers \[0, 1, .*27\] global"):
        ModelSpec.from_file(write(tmp_path, qwen2))


@pytest.mark.parametrize(
    ("change", "field", "accepted"),
    [
        ({"model_type": "llama4"}, "model_type='llama4'", ", ".join(MODEL_TYPES)),
        ({"hidden_size": None}, "hidden_size=None", "a positive integer"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers='32'", "a positive integer"),
        ({"tie_word_embeddings": 0}, "tie_word_embeddings=0", "true or false"),
        ({"intermediate_size": ...}, "intermediate_size is missing", "a positive integer"),
        ({"vocab_size": ...}, "vocab_size is missing", "a positive integer"),
        ({"max_position_embeddings": ...}, "max_position_embeddings is missing", "a positive"),
        ({"num_key_value_heads": 5}, "num_kv_heads=5 does not divide", "a divisor of num_heads"),
    ],
)
def test_a_bad_or_missing_field_is_refused_by_name(tmp_path, change, field, accepted):
    config = {k: v for k, v in {**LLAMA3_8B, **change}.items() if v is not ...}
    path = write(tmp_path, config)
    with pytest.raises(MeshConfigError) as err:
        ModelSpec.from_file(path)
    message = str(err.value)
    assert path in message and field in message and f"accepted: {accepted}" in message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**GPT_OSS_120B, "layer_types": ["full_attention"] + ["sliding_attention"] * 35},
         r"layer_types make layers \[0\] global, not every k-th layer; accepted: every layer"),
        ({**GPT_OSS_120B, "layer_types": ["chunked_attention"] * 36},
         r"layer_types=\['chunked_attention'.*accepted: a list of num_hidden_layers=36"),
        ({**QWEN3_235B, "mlp_only_layers": [0, 5]},
         r"decoder_sparse_step=1, mlp_only_layers=\[0, 5\] make layers \[1, 2, 3, 4, 6, .*"
         r"ModelSpec does not express; accepted: first_dense_layers"),
        ({**MIXTRAL_8X7B, "num_experts": 4},
         r"expert counts \{'num_local_experts': 8, 'num_experts': 4\} disagree"),
        ({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"},
         r"the expert count is missing; accepted: num_local_experts or num_experts or"),
        ({**DEEPSEEK_V3, "scoring_func": "sqrtsoftplus"},
         r"scoring_func='sqrtsoftplus'; accepted: sigmoid, softmax"),
        ({**GEMMA3_12B, "text_config": []}, r"text_config=\[\]; accepted: an object"),
        ({**GEMMA2_9B, "use_bidirectional_attention": True},
         r"use_bidirectional_attention=True \(an encoder\); accepted: a causal decoder"),
    ],
)  # fmt: skip
def test_what_modelspec_does_not_express_is_refused_by_name(tmp_path, config, message):
    path = write(tmp_path, config)
    with pytest.raises(MeshConfigError, match=message) as err:
        ModelSpec.from_file(path)
    assert path in str(err.value)


def test_names_files_and_the_catalogue_schema(tmp_path):
    named = {**LLAMA3_8B, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
    assert ModelSpec.from_file(write(tmp_path, named, folder="x")).name == "Meta-Llama-3-8B"
    assert ModelSpec.from_file(write(tmp_path, LLAMA3_8B, "my-llama.json")).name == "my-llama"
    cache = "models--meta-llama--Meta-Llama-3-8B/snapshots/8cde5ca8"
    assert ModelSpec.from_file(write(tmp_path, LLAMA3_8B, folder=cache)).name == "Meta-Llama-3-8B"
    toml = Path(__file__).parents[2] / "configs" / "models" / "gemma3-12b.toml"
    assert ModelSpec.from_file(toml) == ModelSpec.from_name("gemma3-12b")
    with pytest.raises(MeshConfigError, match="no readable JSON file"):
        ModelSpec.from_file(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(MeshConfigError, match=r"not a JSON object; accepted: a config\.json"):
        ModelSpec.from_file(tmp_path / "list.json")
