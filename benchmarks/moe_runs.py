"""The measured mixture-of-experts runs of docs/facts/moe_runs.md (section 2a) as data: each
published MaxText run on TPU with the recipe its source gives, in this project's terms (the
fields of benchmarks/production_runs.py, plus the ones below).

Extra fields: `seq_len` (the run's max_target_length where the catalogue model's differs:
mixtral-8x7b's catalogue entry keeps the model card's 32768); `mesh` (axis names, ICI shape and
batch axes, MeshConfig's arguments) in place of `preset` / `overrides`; `attention_flops`
("causal" or "noncausal": how MaxText counted attention when the run was published; it counted
it whole before 2025-07-22, moe_runs.md section 0.2).

The mesh. MaxText's default logical rules shard an expert weight's expert dim over its `expert`
axis and its d_model (`embed_no_exp`) over `fsdp`; with `ici_expert_parallelism` 1, as in
every run here, the experts are whole on each device and their d_model cut over fsdp. That is
this project's layout for a mesh with an `expert` axis of size 1 (workload/layout.py), so each
run's mesh carries one; without it the experts' own dim would go over fsdp (MaxText's later
`shard_exp_on_fsdp`), which none of these recipes sets, and which 8 or 16 experts over fsdp 256
or 512 could not do.

The MoE path. `megablox=False` with `capacity_factor=1.25` (M1-M5) is MaxText's dropping path:
dense einsums over capacity slots, priced here as TrainSpec(moe="capacity"); megablox with
`sparse_matmul` (M8-M11) is its dropless grouped-matmul path, moe="dropless". Published MoE
throughput is balanced-load throughput (moe_runs.md section 0.5): routing="balanced".

Remat: MaxText's custom names map as in production_runs.py (decoder_layer_input ->
layer_input, query_proj / key_proj / value_proj -> query / key / value, out_proj -> out_proj;
names not set stay recomputed).
"""

from __future__ import annotations

from typing import Any

_TR_MIX = (
    "https://github.com/AI-Hypercomputer/tpu-recipes/blob/{at}/training/trillium/"
    "Mixtral-8x7B-MaxText/README.md ({what}, in AI-Hypercomputer/maxtext "
    "benchmarks/maxtext_trillium_model_configs.py)"
)
_TR_V5P = (
    "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/v5p/{path}/README.md "
    "(step line logged there); config {config} in AI-Hypercomputer/maxtext @{mx} "
    "benchmarks/maxtext_v5p_model_configs.py"
)
# MaxText's custom remat of the v6e Mixtral (from 2025-03) and v5p Maverick recipes:
# decoder_layer_input, out_proj and query/key/value_proj offloaded.
OFFLOAD_QKV_OUT = {t: "offload" for t in ("layer_input", "query", "key", "value", "out_proj")}
# The fsdp mesh of these recipes, with the expert axis of size 1 MaxText's rules imply.
_FSDP = ("fsdp", "expert")
_DROPPING = {"moe": "capacity", "capacity_factor": 1.25, "routing": "balanced"}
_DROPLESS = {"moe": "dropless", "routing": "balanced"}
_MIX_NOTES = (
    "MaxText's dropping path (megablox=False, capacity_factor 1.25): einsum dispatch and combine "
    "over capacity slots (this step: the capacity slots gathered and scattered by index); splash "
    "blocks 2048 (this step: 512); XLA flags of the recipe"
)


def _mixtral_v6e(
    name: str, pdbs: int, remat: Any, step: float, tflops: float, at: str, what: str
) -> dict:
    return {
        "name": name,
        "hardware": "tpu-v6e-256",
        "model": "mixtral-8x7b",
        "seq_len": 4096,
        "mesh": {"axes": _FSDP, "shape": (256, 1), "batch": _FSDP},
        "train": {"global_batch": pdbs * 256, "remat": remat, **_DROPPING},
        "step_seconds": step,
        "tflops_per_device": tflops,
        "attention_flops": "noncausal",
        "source": _TR_MIX.format(at=at, what=what),
        "notes": _MIX_NOTES,
    }


# (name, pdbs, remat, logged step, TFLOP/s, tpu-recipes commit, what the source says)
_MIXTRAL_V6E = [
    ("M1 Mixtral-8x7B v6e-256 full", 8, "full", 8.982, 302.566, "5f53866",
     "step 19 logged; libtpu 20241009; config mixtral_8x7b_dropped @770fcf7d1"),
    ("M2 Mixtral-8x7B v6e-256 full", 8, "full", 8.409, 323.173, "372537f",
     "step 19 logged; maxtext e7292a3a5, libtpu 20241028; config mixtral_8x7b_dropped"),
    ("M4 Mixtral-8x7B v6e-256 offload", 12, OFFLOAD_QKV_OUT, 13.360, 305.127, "f190d41",
     "step 10 logged; maxtext tpu-recipes-v0.1.0, JAX 0.4.37; config mixtral_8x7b_dropped"),
    ("M5 Mixtral-8x7B v6e-256 offload", 12, OFFLOAD_QKV_OUT, 13.484, 302.311, "main",
     "step 11 logged; maxtext tpu-recipes-v0.1.2, JAX 0.5.2; config mixtral_8x7b_dropped"),
]  # fmt: skip

MOE_RUNS: list[dict[str, Any]] = [_mixtral_v6e(*row) for row in _MIXTRAL_V6E]
# M3: M2's recipe with MaxText's `quantization=int8` (AQT int8 matmuls at the time), the one
# quantized MoE run with a logged step: priced with its precision, never fitted on
# (benchmarks/bench_moe_time.py and bench_precision.py judge it).
_M3 = _mixtral_v6e(
    "M3 Mixtral-8x7B v6e-256 full int8", 8, "full", 8.218, 330.683, "f81bfc9",
    "step 18 logged; config mixtral_8x7b_dropped_int8 (quantization=int8)",
)  # fmt: skip
_M3["train"] |= {"quantization": "int8"}
_M3["notes"] += (
    "; quantization=int8 (TrainSpec.quantization: the projections' and experts' matmuls)"
)
MOE_RUNS.insert(2, _M3)
MOE_RUNS += [
    {
        "name": "M8 Mixtral-8x7B v5p-256 full",
        # "256 Chips(8x4x4)": 8x4x4 is 128 chips, 256 TensorCores, i.e. v5p-256 [I]; under
        # fsdp a device's step hardly depends on the slice size
        "hardware": "tpu-v5p-256",
        "model": "mixtral-8x7b",
        "seq_len": 4096,
        "mesh": {"axes": _FSDP, "shape": (128, 1), "batch": _FSDP},
        "train": {"global_batch": 36 * 128, "remat": "full", **_DROPLESS},
        "step_seconds": None,  # from the MFU: the FLOPs MaxText counted over MFU x peak
        "tflops_per_device": 241.3,
        "mfu": 0.5256,
        "attention_flops": "noncausal",
        "source": "https://github.com/AI-Hypercomputer/maxtext/blob/e591f30/docs/reference/"
        "models/tiering.md (v5p Mixtral 8X7B, 52.56% MFU, ~2,909 tok/s/dev); recipe "
        "AI-Hypercomputer/tpu-recipes training/v5p/Mixtral-8X7B-Maxtext/scripts/"
        "run_mixtral-8x7b.sh (pdbs 36, seq 4096, ici_fsdp -1, remat full, MaxText's defaults: "
        "megablox dropless)",
        "notes": "the tiering table names no date, mesh or step; the recipe it links gives "
        "the batch and remat; the hardware label is read as 128 chips",
    },
    {
        "name": "M9 Llama4-Maverick v5p-256",
        "hardware": "tpu-v5p-256",
        "model": "llama4-maverick-17b-128e",
        "mesh": {"axes": ("fsdp", "expert", "model"), "shape": (32, 1, 4), "batch": _FSDP},
        "train": {"global_batch": 4 * 128, "remat": OFFLOAD_QKV_OUT, **_DROPLESS},
        "step_seconds": 24.792,
        "tflops_per_device": 160.005,
        "attention_flops": "noncausal",
        "source": _TR_V5P.format(
            path="Llama4-Maverick-17B-128E-Maxtext",
            config="llama4_maverick_dropless_v5p_256",
            mx="9ca35d7",
        ),
        "notes": "ici_fsdp 32 x ici_tensor 4; megablox and sparse_matmul (dropless); splash "
        "blocks 2048 (this step: 512); attention chunked at 8192 = the sequence (no effect); "
        "every 4th layer without RoPE (not modelled: rotary is a memory-bound sliver)",
    },
    {
        "name": "M10 Llama4-Scout v5p-1024",
        # total_weights 33554432 = 8 x 8192 x 512: 512 chips (moe_runs.md, M10 [I])
        "hardware": "tpu-v5p-1024",
        "model": "llama4-scout-17b-16e",
        "mesh": {"axes": _FSDP, "shape": (512, 1), "batch": _FSDP},
        "train": {"global_batch": 8 * 512, "remat": "offload", **_DROPLESS},
        "step_seconds": 31.652,
        "tflops_per_device": 225.491,
        "attention_flops": "causal",
        "source": _TR_V5P.format(
            path="Llama4-Scout-17B-16E-Maxtext",
            config="llama4_scout_dropless_v5p_256 ('v5p_1024 should be tested with the same "
            "configuration')",
            mx="3eb77db",
        ),
        "notes": "remat custom: decoder_layer_input offloaded (this project's 'offload'); "
        "megablox and sparse_matmul (dropless); splash blocks 2048 (this step: 512); attention "
        "chunked at 8192 = the sequence (no effect); every 4th layer without RoPE",
    },
    {
        "name": "M11 DeepSeek-V3 v5p-1024",
        # total_weights 25165824 = 6 x 8192 x 512: 512 chips (moe_runs.md, M11 [I])
        "hardware": "tpu-v5p-1024",
        "model": "deepseek-v3",
        "seq_len": 8192,
        "mesh": {"axes": _FSDP, "shape": (512, 1), "batch": _FSDP},
        "train": {
            "global_batch": 6 * 512,
            "remat": {"layer_input": "offload", "out_proj": "offload"},
            **_DROPLESS,
        },
        "step_seconds": 90.668,
        "tflops_per_device": 152.415,
        "attention_flops": "causal",
        "source": _TR_V5P.format(
            path="DeepSeek3-671B-MaxText", config="deepseek3_671b_v5p_1024", mx="3eb77db"
        ),
        "notes": "ici_fsdp -1 (512), ici_tensor 1: no expert parallelism; remat custom: "
        "decoder_layer_input and out_proj offloaded; megablox and sparse_matmul (dropless), "
        "use_custom_sort_vjp; tiles 512 / 1024 / 1024; splash blocks 2048 (this step: 512), "
        "sa_use_fused_bwd_kernel False; bf16 / fp32, adamw",
    },
]

# The training fields of MaxText's published Mixtral 8x22B v6e-256 recipe (`mixtral_8x22b_dropped`
# in AI-Hypercomputer/maxtext benchmarks/maxtext_trillium_model_configs.py: pdbs 8, seq 4096,
# ici_fsdp 64 x ici_expert 4, decoder_layer_input, out_proj and q/k/v offloaded, megablox and
# sparse_matmul off, capacity_factor 1.25, weight_dtype bfloat16): a recipe to set beside the
# choice, not a calibration row (its logged step is not used here). Adam's moments taken in
# bfloat16 with the weights (optax follows the parameters' dtype).
MIXTRAL_8X22B = {
    "param_dtype": "bfloat16",
    "opt_state_dtype": "bfloat16",
    **_DROPPING,
}

# Section 2a's rows this project cannot state as a run, and why.
MOE_SKIPPED = {
    "M7 Mixtral-8x7B v5p-128 (251.94 TFLOP/s, 54.89% MFU)": "Run_Mixtral.md states no batch, "
    "mesh, remat or MoE path; M8 (the tiering table's v5p row, with its linked recipe) stands "
    "for the v5p Mixtral MFU statements",
    "U1 Mixtral-8x7B without attention, 8E top-2 vs 56E top-14 (maxtext issue 1256)": "no "
    "batch, mesh or step: a ratio of MFUs at equal FLOPs (benchmarks/bench_moe_time.py prints "
    "the model's ratio beside it)",
}
