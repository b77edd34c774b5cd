"""MaxText config keys from a plan and recipe, and the plans MaxText cannot express."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.export.maxtext import RESIZE_KEYS
from loadax_mesh.plan import MeshPlan
from loadax_mesh.workload import ModelSpec, TrainSpec


def _plan(strategy: str, hardware: str) -> MeshPlan:
    return MeshConfig.from_preset(strategy).plan(simulate_devices(hardware), selector=hardware)


def test_multislice_fsdp_tp_keys_name_each_degree_on_its_network() -> None:
    plan = _plan("fsdp_tp", "tpu-v5litepod-256-2")  # ICI (1, 64, 4), DCN (2, 1, 1)
    keys = plan.to_maxtext(TrainSpec(global_batch=1024), order=False).keys
    assert {k: keys[k] for k in keys if k.endswith("_parallelism")} == {
        "ici_data_parallelism": "1",
        "ici_fsdp_parallelism": "64",
        "ici_tensor_parallelism": "4",
        "ici_context_parallelism": "1",
        "dcn_data_parallelism": "2",
        "dcn_fsdp_parallelism": "1",
        "dcn_tensor_parallelism": "1",
        "dcn_context_parallelism": "1",
    }
    assert keys["per_device_batch_size"] == "2"  # 1024 rows over 512 chips
    assert keys["remat_policy"] == "full" and keys["weight_dtype"] == "float32"
    assert keys["attention"] == "flash"


def test_the_recipe_becomes_custom_remat_accumulation_and_vocab_tiling() -> None:
    plan = _plan("fsdp_tp", "tpu-v5p-128")  # 64 chips: fsdp 16 x model 4
    train = TrainSpec(
        global_batch=64,
        remat={"layer_input": "offload", "query": "device", "mlp_in": "offload"},
        microbatches=4,
        logits_chunks=8,
        param_dtype="bfloat16",
        opt_state_dtype="bfloat16",
    )
    config = plan.to_maxtext(train, model=ModelSpec.from_name("llama3-8b"), order=False)
    keys = config.keys
    # per micro-batch: 64 rows / 4 micro-batches / 64 devices (each fsdp shard holds one row)
    assert keys["per_device_batch_size"] == "0.25"
    assert keys["gradient_accumulation_steps"] == "4" and keys["num_vocab_tiling"] == "8"
    assert keys["remat_policy"] == "custom"
    assert keys["decoder_layer_input"] == "offload" and keys["query_proj"] == "device"
    assert keys["mlpwi_0"] == keys["mlpwi_1"] == "offload" and keys["mlpwo"] == "remat"
    assert keys["key_proj"] == keys["attention_out"] == keys["out_proj"] == "remat"
    assert keys["weight_dtype"] == "bfloat16"
    assert keys["model_name"] == "llama3-8b" and keys["max_target_length"] == "8192"
    assert "per_device_batch_size=0.25" in config.args()
    assert config.text().splitlines()[-1] == "max_target_length=8192"


def test_a_model_maxtext_does_not_ship_is_written_as_its_shape() -> None:
    keys = (
        _plan("fsdp", "tpu-v5litepod-8")
        .to_maxtext(TrainSpec(global_batch=8), model=ModelSpec.from_name("tiny"), order=False)
        .keys
    )
    assert "model_name" not in keys
    assert (keys["base_emb_dim"], keys["base_num_kv_heads"], keys["head_dim"]) == ("128", "4", "16")


def test_a_two_matrix_tied_model_is_written_with_its_activation_and_one_table() -> None:
    """MaxText's 2023 16B as its MlpBlock and embedding spell it: one activation (relu: w_up
    is MaxText's `wi`, remat key mlpwi), logits through the embedding, not divided by
    sqrt(d_model) as MaxText's default does and the step does not."""
    model = replace(ModelSpec.from_name("maxtext-2023-16b"), parallel_block=False)
    train = TrainSpec(global_batch=256, remat="dots")
    keys = _plan("fsdp", "tpu-v5litepod-256").to_maxtext(train, model=model, order=False).keys
    assert keys["mlp_activations"] == "['relu']" and keys["logits_via_embedding"] == "true"
    assert keys["normalize_embedding_logits"] == "false"
    assert keys["mlpwi"] == keys["mlpwo"] == "device" and "mlpwi_0" not in keys
    assert (keys["base_num_query_heads"], keys["head_dim"], keys["base_emb_dim"]) == (
        "32",
        "256",
        "5120",
    )
    llama = _plan("fsdp", "tpu-v5litepod-8").to_maxtext(
        TrainSpec(global_batch=8), model=ModelSpec.from_name("tiny"), order=False
    )
    assert llama.keys["mlp_activations"] == "['silu','linear']"
    assert "normalize_embedding_logits" not in llama.keys


def test_a_parallel_block_is_refused_naming_the_field() -> None:
    """MaxText's 2023 layer (attention and the MLP off one norm) is not among today's decoder
    blocks: exporting it would train a different model."""
    model = ModelSpec.from_name("maxtext-2023-16b")
    with pytest.raises(MeshConfigError, match="parallel_block=True has no MaxText key"):
        _plan("fsdp", "tpu-v5litepod-256").to_maxtext(
            TrainSpec(global_batch=256), model=model, order=False
        )


def test_sequence_parallel_is_maxtext_context_with_its_strategy_and_load_balance() -> None:
    plan = _plan("dp_sp", "tpu-v5litepod-8")
    config = plan.to_maxtext(TrainSpec(global_batch=4), order=False)
    assert config.keys["ici_context_parallelism"] == "4"
    assert config.keys["ici_data_parallelism"] == "2"
    assert config.keys["per_device_batch_size"] == "0.5"
    assert config.keys["context_parallel_strategy"] == "all_gather"
    assert config.keys["context_parallel_load_balance"] == "true"
    train = TrainSpec(global_batch=4, context_strategy="ring", context_load_balance=False)
    ring = plan.to_maxtext(train, order=False)
    assert ring.keys["context_parallel_strategy"] == "ring"
    assert ring.keys["context_parallel_load_balance"] == "false"
    plain = _plan("fsdp", "tpu-v5litepod-8").to_maxtext(TrainSpec(global_batch=8), order=False)
    assert "context_parallel_strategy" not in plain.keys


def test_tpu_ring_asks_for_tokamax_splash_and_what_maxtext_refuses_is_refused() -> None:
    """MaxText's TPU ring is tokamax's splash ring kernel: its config check refuses the ring
    without use_tokamax_splash=true (found by train_compile), and with plain attention or a
    sequence not divisible by the context size squared."""
    plan = _plan("dp_sp", "tpu-v5litepod-8")  # seq 4
    model = ModelSpec.from_name("llama3-8b")
    ring = plan.to_maxtext(
        TrainSpec(global_batch=4, context_strategy="ring"), model=model, order=False
    )
    assert ring.keys["use_tokamax_splash"] == "true"
    assert ring.keys["attention"] == "flash"
    gathered = plan.to_maxtext(TrainSpec(global_batch=4), model=model, order=False)
    assert "use_tokamax_splash" not in gathered.keys
    with pytest.raises(MeshConfigError, match="attention='plain'"):
        plan.to_maxtext(
            TrainSpec(global_batch=4, context_strategy="ring", attention="plain"), order=False
        )
    odd = replace(model, seq_len=8200)  # 8200 % 16 == 8
    with pytest.raises(MeshConfigError, match="seq_len=8200"):
        plan.to_maxtext(TrainSpec(global_batch=4, context_strategy="ring"), model=odd, order=False)
    gpu = _plan("dp_sp", "gpu-p5.48xlarge-8")  # MaxText's GPU ring has none of these checks
    keys = gpu.to_maxtext(TrainSpec(global_batch=4, context_strategy="ring"), order=False).keys
    assert keys["context_parallel_strategy"] == "ring" and "use_tokamax_splash" not in keys


def test_maxtext_order_is_judged_beside_ours_and_split_axes_are_asked_for() -> None:
    plan = _plan("fsdp_tp", "tpu-v5litepod-256-2")
    config = plan.to_maxtext(TrainSpec(global_batch=512))
    order = config.order
    assert order is not None and order.theirs is not None
    # jax's mesh_utils cannot put model=4 on whole axes of a 16x16 slice: MaxText must split
    assert order.split and config.keys["allow_split_physical_axes"] == "true"
    assert set(order.theirs) == set(plan.axis_names)
    assert order.ours["model"].efficiency == 1.0 and order.theirs["model"].efficiency < 1.0
    text = config.text()
    assert "axis model (4): ring efficiency ours 1.00, MaxText's mesh_utils 0.67" in text
    # one slice of v5p: mesh_utils runs fsdp=64 row-major over the 4x4x4 torus, no closed ring
    fsdp = _plan("fsdp", "tpu-v5p-128").to_maxtext(TrainSpec(global_batch=64)).order
    assert fsdp is not None and fsdp.theirs is not None
    assert fsdp.ours["fsdp"].efficiency == 1.0 > fsdp.theirs["fsdp"].efficiency


def test_an_axis_maxtext_has_no_name_for_is_refused() -> None:
    plan = MeshConfig((2, 4), ("data", "stage"), "data").plan(simulate_devices("cpu-8"))
    with pytest.raises(MeshConfigError, match=r"mesh axis 'stage' .size 4. has no MaxText name"):
        plan.to_maxtext(TrainSpec(global_batch=8))


def test_a_recipe_field_maxtext_lacks_is_refused() -> None:
    plan = _plan("fsdp", "tpu-v5litepod-8")
    with pytest.raises(MeshConfigError, match=r"opt_state_dtype='bfloat16'.*mu_dtype"):
        plan.to_maxtext(TrainSpec(global_batch=8, opt_state_dtype="bfloat16"), order=False)


def test_plans_maxtext_reads_otherwise_are_refused() -> None:
    devices = simulate_devices("cpu-8")
    two_data = MeshConfig((2, 4), ("data", "replicate"), ("data", "replicate")).plan(devices)
    with pytest.raises(MeshConfigError, match=r"one data axis"):
        two_data.to_maxtext(TrainSpec(global_batch=8), order=False)
    tensor_batch = MeshConfig((2, 4), ("data", "model"), ("data", "model")).plan(devices)
    with pytest.raises(MeshConfigError, match=r"'model' is a batch axis.*tensor axis"):
        tensor_batch.to_maxtext(TrainSpec(global_batch=8), order=False)
    fsdp_not_batch = MeshConfig((2, 4), ("data", "fsdp"), "data").plan(devices)
    with pytest.raises(MeshConfigError, match=r"always splits the batch over fsdp"):
        fsdp_not_batch.to_maxtext(TrainSpec(global_batch=8), order=False)
    fsdp = MeshConfig((8,), ("fsdp",), "fsdp").plan(devices)
    with pytest.raises(MeshConfigError, match=r"micro-batch of 4 rows .* 8 shards"):
        fsdp.to_maxtext(TrainSpec(global_batch=8, microbatches=2), order=False)


def test_an_expert_axis_and_a_moe_model_become_maxtexts_expert_keys() -> None:
    plan = _plan("fsdp_ep", "tpu-v5p-128")  # 64 chips: fsdp 16 x expert 4
    mixtral = ModelSpec.from_name("mixtral-8x7b")
    config = plan.to_maxtext(TrainSpec(global_batch=64), model=mixtral, order=False)
    keys = config.keys
    assert (keys["ici_fsdp_parallelism"], keys["ici_expert_parallelism"]) == ("16", "4")
    assert keys["dcn_expert_parallelism"] == "1" and "shard_exp_on_fsdp" not in keys
    assert keys["model_name"] == "mixtral-8x7b" and keys["per_device_batch_size"] == "1"
    assert "override_model_config" not in keys  # the shipped model, as shipped
    assert (keys["sparse_matmul"], keys["megablox"], keys["capacity_factor"]) == (
        "true",
        "true",
        "-1",
    )
    dropping = TrainSpec(global_batch=64, moe="capacity", capacity_factor=1.5, routing="balanced")
    keys = plan.to_maxtext(dropping, model=mixtral, order=False).keys
    assert (keys["sparse_matmul"], keys["megablox"], keys["capacity_factor"]) == (
        "false",
        "false",
        "1.5",
    )
    assert keys["use_random_routing"] == "true"
    # no expert axis: the experts' d_model shards over fsdp, MaxText's default layout
    keys = _plan("fsdp", "tpu-v5p-16").to_maxtext(dropping, model=mixtral, order=False).keys
    assert keys["ici_expert_parallelism"] == "1" and keys["capacity_factor"] == "1.5"
    assert keys["ici_fsdp_parallelism"] == "8" and "shard_exp_on_fsdp" not in keys
    scout = ModelSpec.from_name("llama4-scout-17b-16e")
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=scout, order=False).keys
    assert keys["model_name"] == "llama4-17b-16e"
    # a dense model on a plan without an expert axis gets no MoE keys
    keys = _plan("fsdp", "tpu-v5p-128").to_maxtext(TrainSpec(global_batch=64), order=False).keys
    assert "sparse_matmul" not in keys and "ici_expert_parallelism" not in keys


def test_a_shipped_model_resized_overrides_maxtexts_config_of_it() -> None:
    from dataclasses import replace

    plan = _plan("fsdp_ep", "tpu-v5p-128")
    short = replace(ModelSpec.from_name("mixtral-8x7b"), num_layers=4, seq_len=8192)
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=short, order=False).keys
    assert keys["model_name"] == "mixtral-8x7b" and keys["override_model_config"] == "true"
    assert keys["base_num_decoder_layers"] == "4" and keys["max_target_length"] == "8192"
    assert "base_emb_dim" not in keys  # only what differs from the shipped config
    narrow = replace(ModelSpec.from_name("llama3-405b"), num_layers=2, d_ff=1024)
    keys = _plan("fsdp", "tpu-v5p-128").to_maxtext(TrainSpec(global_batch=64), model=narrow).keys
    assert (keys["base_num_decoder_layers"], keys["base_mlp_dim"]) == ("2", "1024")
    tied = replace(ModelSpec.from_name("llama3-8b"), tied_embeddings=True)
    with pytest.raises(MeshConfigError, match=r"tied_embeddings=True differ from the shipped"):
        plan.to_maxtext(TrainSpec(global_batch=64), model=tied, order=False)


def test_deepseek_v3_is_maxtexts_deepseek3_671b_and_resizes_with_its_mla_and_moe_keys() -> None:
    from dataclasses import replace

    # every key name below is grepped in MaxText's src/maxtext/configs/base.yml and
    # models/deepseek3-671b.yml (q_lora_rank ... v_head_dim, first_num_dense_layers,
    # routed_scaling_factor, shared_experts, num_experts(_per_tok), base_moe_mlp_dim)
    plan = _plan("fsdp_ep", "tpu-v5p-128")
    deepseek = ModelSpec.from_name("deepseek-v3")
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=deepseek, order=False).keys
    assert keys["model_name"] == "deepseek3-671b" and "override_model_config" not in keys
    assert (keys["ici_expert_parallelism"], keys["sparse_matmul"]) == ("4", "true")
    assert "q_lora_rank" not in keys and "num_experts" not in keys  # MaxText's config has them
    small = replace(
        deepseek, num_layers=4, first_dense_layers=1, num_experts=16, experts_per_token=2,
        moe_d_ff=512, num_shared_experts=2, routed_scaling=1.5, q_lora_rank=256,
        kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, head_dim=96, v_head_dim=64,
    )  # fmt: skip
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=small, order=False).keys
    assert keys["model_name"] == "deepseek3-671b" and keys["override_model_config"] == "true"
    assert {k: keys[k] for k in keys if k in RESIZE_KEYS.values()} == {
        "base_num_decoder_layers": "4",
        "first_num_dense_layers": "1",
        "num_experts": "16",
        "num_experts_per_tok": "2",
        "base_moe_mlp_dim": "512",
        "shared_experts": "2",
        "routed_scaling_factor": "1.5",
        "q_lora_rank": "256",
        "kv_lora_rank": "128",
        "qk_nope_head_dim": "64",
        "qk_rope_head_dim": "32",
        "v_head_dim": "64",
    }  # no head_dim: MaxText's MLA heads are qk_nope + qk_rope wide
    softmax = replace(deepseek, router="softmax")
    with pytest.raises(MeshConfigError, match=r"router='softmax' differ from the shipped"):
        plan.to_maxtext(TrainSpec(global_batch=64), model=softmax, order=False)


def test_moe_models_maxtext_does_not_ship_are_refused() -> None:
    from dataclasses import replace

    plan = _plan("fsdp_ep", "tpu-v5p-128")
    custom = replace(ModelSpec.from_name("mixtral-8x7b"), name="my-moe")
    with pytest.raises(MeshConfigError, match=r"num_experts=8 in a model MaxText does not ship"):
        plan.to_maxtext(TrainSpec(global_batch=64), model=custom, order=False)
    mla = replace(
        ModelSpec.from_name("deepseek-v3"), name="my-mla", num_experts=0, experts_per_token=0,
        moe_d_ff=0, num_shared_experts=0, first_dense_layers=0, router="softmax",
        routed_scaling=1.0,
    )  # fmt: skip
    with pytest.raises(MeshConfigError, match=r"attention='mla' in a model MaxText does not"):
        plan.to_maxtext(TrainSpec(global_batch=64), model=mla, order=False)
