"""The calibration set of docs/facts/production_runs.md as data: each published run with the
recipe its source gives, in this project's terms.

Each run: `name`; `hardware` (a hardware string of the catalogue); `compile_hardware` (where
the run spans many DCN-joined slices or hosts whose per-device program is that of one: the
hardware to compile; else the same); `model` (configs/models/<model>.toml); `preset` and
`overrides` (MeshConfig.from_preset(preset, **overrides)); `train` (TrainSpec keyword
arguments; `global_batch` for `hardware`) and `compile_batch` (for `compile_hardware`);
`step_seconds` and `tflops_per_device` as logged (None where the source gives none); `source`;
`notes` (what of the recipe this project's step does not express); GPU runs also
`gpu_mem_fraction`, the share of GPU memory the run's script let jax's client take. Part two's
runs (below) also carry `part` (2), and those of MaxText's 2023 tables `mfu` (as published) and
`attention_flops` (how their trainer counted attention: "causal" or "noncausal").

LLaMA-3.1 8B and 70B have LLaMA-3's shapes (configs/models/llama3-8b.toml, llama3-70b.toml,
both seq 8192, as the runs' max_target_length). MaxText's custom remat names map onto a
layer's tensors: decoder_layer_input -> layer_input, query_proj / key_proj / value_proj ->
query / key / value, out_proj -> out_proj; names not set stay recomputed ("remat"), MaxText's
default for a custom policy. Its `minimal_flash` saves the matmul outputs (dots without batch
dims) and the attention output (`context`): every named tensor on the device, the rest
recomputed (kept as pairs, not TrainSpec's "none", which checkpoints nothing). None of these
runs accumulates gradients or tiles the vocabulary (MaxText's defaults:
gradient_accumulation_steps 1, num_vocab_tiling 1), so `microbatches` and `logits_chunks`
stay 1. MaxText's default weights are float32, Adam moments float32; the one
run with `weight_dtype: bfloat16` (70B on v6e-32) is taken to keep its Adam moments in
bfloat16 too (optax infers them from the parameters' dtype unless told otherwise): assumed,
not read in that run's source.
"""

from __future__ import annotations

from typing import Any

_TR = (
    "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/trillium/"
    "{model}-MaxText/{slice}/README.md (tuning_params; step line logged there)"
)
_MA3 = (
    "https://github.com/AI-Hypercomputer/maxtext/blob/78daad198544def8274dbd656d122fbe6a0e1129/"
    "MaxText/configs/a3/llama_2_7b/{n}vm.sh (ici_fsdp_parallelism=8, dcn_data_parallelism={n}, "
    "per_device_batch_size=4, max_target_length=4096, remat_policy=minimal_flash, "
    "attention=cudnn_flash_te, scan_layers=false, XLA_PYTHON_CLIENT_MEM_FRACTION=0.85); "
    "TFLOP/s per chip from README.md there"
)
# tpu-recipes' custom policies (remat_policy=custom).
OFFLOAD_8B = {
    "layer_input": "offload",
    "query": "offload",
    "key": "offload",
    "value": "offload",
    "out_proj": "offload",
}
OFFLOAD_70B = {"layer_input": "offload", "query": "offload", "key": "offload", "value": "offload"}
MINIMAL_FLASH = {t: "device" for t in ("query", "key", "value", "attention_out", "out_proj")} | {
    "mlp_in": "device",
    "mlp_out": "device",
}
_TR_NOTES = (
    "splash blocks 2048 (sa_block_*), fused backward kernel; XLA flags for host offload, "
    "collective overlap and VMEM limits; this step uses splash blocks of 512"
)


def _tpu(model: str, chips: int, pdbs: int, step: float, tflops: float, **extra: Any) -> dict:
    remat = OFFLOAD_8B if model == "llama3-8b" else OFFLOAD_70B
    tr_model = "Llama3.1-8B" if model == "llama3-8b" else "Llama3.1-70B"
    train = {"global_batch": pdbs * chips, "remat": remat, **extra}
    return {
        "name": f"{tr_model} v6e-{chips}",
        "hardware": f"tpu-v6e-{chips}",
        "compile_hardware": f"tpu-v6e-{chips}",
        "model": model,
        "preset": "fsdp",
        "overrides": {},
        "train": train,
        "compile_batch": pdbs * chips,
        "step_seconds": step,
        "tflops_per_device": tflops,
        "source": _TR.format(model=tr_model, slice=f"v6e-{chips}"),
        "notes": _TR_NOTES,
    }


def _a3(hosts: int, tflops: float) -> dict:
    gpus = 8 * hosts
    return {
        "name": f"Llama2-7B A3 {hosts} host{'s' * (hosts > 1)}",
        "hardware": f"gpu-a3-highgpu-8g-{gpus}",
        # Data parallel over hosts (DCN): each host runs the one-host program with the same
        # per-device batch; its memory is that of one host's.
        "compile_hardware": "gpu-a3-highgpu-8g-8",
        "model": "llama2-7b",
        "preset": "fsdp",
        "overrides": {},
        "train": {"global_batch": 4 * gpus, "remat": MINIMAL_FLASH},
        "compile_batch": 32,
        "step_seconds": None,
        "tflops_per_device": tflops,
        # The share of GPU memory jax's client preallocated in the run (its script), where the
        # catalogue's default is jax's 0.75.
        "gpu_mem_fraction": 0.85,
        "source": _MA3.format(n=hosts),
        "notes": "layers not scanned (scan_layers=false; this step scans them); XLA flags: "
        "latency-hiding scheduler, pipelined collectives, XLA's own rematerialization pass "
        "disabled",
    }


RUNS: list[dict[str, Any]] = [
    _tpu("llama3-8b", 8, 3, 3.443, 413.4),
    _tpu("llama3-8b", 16, 3, 3.393, 419.5),
    _tpu("llama3-8b", 32, 3, 3.495, 407.2),
    _tpu("llama3-8b", 64, 5, 5.652, 419.7),
    _tpu("llama3-8b", 128, 4, 4.602, 412.3),
    _tpu("llama3-8b", 256, 4, 4.546, 417.4),
    _tpu("llama3-70b", 32, 2, 17.790, 443.4, param_dtype="bfloat16", opt_state_dtype="bfloat16"),
    _tpu("llama3-70b", 64, 2, 18.688, 422.1),
    _tpu("llama3-70b", 128, 4, 34.786, 453.5),
    _tpu("llama3-70b", 256, 5, 42.656, 462.3),
    _a3(1, 492),
    _a3(2, 422),
    _a3(4, 407),
    _a3(8, 409),
    _a3(16, 375),
]


# -- Part two: more generations, more slices (docs/facts/production_runs.md, 2026-11-26) --------
#
# MaxText's own v4, v5e and v5p tables (committed with their .sh configs in 76bd53b0f,
# 2023-12-15): the 2023 `global_parameter_scale` models (configs/models/maxtext-2023-*.toml:
# ReLU two-matrix MLP, multi-head attention with head_dim 256, tied embeddings, a parallel
# block), seq 2048, N slices joined over DCN with data parallelism across them
# (dcn_data_parallelism=-1). Their remat names at that commit (MaxText/layers/models.py):
# `full` saves nothing inside the layer (ours "full"); `minimal` is
# jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, the
# policy our "dots" runs (dots_with_no_batch_dims_saveable, the same function). Each row's
# `tflops_per_device` and `mfu` are as published; the logged step is the model FLOPs MaxText
# counted then, over the published MFU times the chip's peak (the MFU has more digits than the
# rounded TFLOP/s; MaxText's peaks, 275, 197 and 459 TFLOP/s, are the catalogue's). MaxText
# counted attention without the causal halving until 2023-11-29 (train.py, commit 64ee4e938):
# the v4 (README 2023-06-07) and v5e (README 2023-11-01) tables count it whole
# (`attention_flops` "noncausal"); the v5p table, first published 2023-12-15, is taken to count
# it halved [I].
_MX2023 = (
    "https://github.com/AI-Hypercomputer/maxtext/blob/76bd53b0f/MaxText/configs/{gen}/README.md "
    "(TFLOP/s and MFU per chip); configs {gen}/*.sh at that commit"
)
_MX2023_NOTES = (
    "the 2023 layer runs attention and the MLP in parallel off one RMSNorm (this step too: "
    "parallel_block) and RMS-norms q, k and v per head (this step does not); attention 'flash' "
    "was jax's Pallas flash_attention with 512 blocks (this step: the splash kernel, 512 "
    "blocks); XLA flags for async collective fusion and data-parallel all-reduce overlap"
)
_GENERATION = {"v4": "tpu-v4", "v5e": "tpu-v5litepod", "v5p": "tpu-v5p"}


def _mx2023(
    size: int,
    gen: str,
    slice_name: str,
    chips: int,
    tensor: int,
    pdbs: int,
    remat: str,
    slices: int,
    tflops: float,
    mfu: float,
) -> dict:
    one = f"{_GENERATION[gen]}-{slice_name}"
    hardware = one if slices == 1 else f"{one}-{slices}"
    name = f"MaxText-2023 {size}B {slices}x {gen}-{slice_name}"
    return {
        "name": name,
        "part": 2,
        "hardware": hardware,
        # data parallel over slices: each slice runs the one-slice program
        "compile_hardware": one,
        "model": f"maxtext-2023-{size}b",
        "preset": "fsdp_tp" if tensor > 1 else "fsdp",
        "overrides": {"tp": tensor} if tensor > 1 else {},
        "train": {"global_batch": pdbs * chips * slices, "remat": remat},
        "compile_batch": pdbs * chips,
        "step_seconds": None,
        "tflops_per_device": tflops,
        "mfu": mfu,
        "attention_flops": "causal" if gen == "v5p" else "noncausal",
        "source": _MX2023.format(gen=gen),
        "notes": _MX2023_NOTES,
    }


# v5p: (size, slice, chips, tensor, pdbs, remat, 1 slice (TFLOP/s, MFU), 2 slices)
_V5P = [
    (32, "128", 64, 4, 8, "dots", (328, 0.7147), (319, 0.6943)),
    (64, "128", 64, 4, 4, "dots", (323, 0.7031), (309, 0.6726)),
    (128, "256", 128, 8, 2, "dots", (315, 0.6868), (305, 0.6634)),
    (128, "512", 256, 8, 2, "dots", (316, 0.6883), (274, 0.5966)),
    (256, "1024", 512, 8, 2, "dots", (308, 0.6709), (289, 0.6299)),
    (512, "1024", 512, 16, 2, "full", (294, 0.6399), (282, 0.6145)),
    (1024, "2048", 1024, 16, 2, "full", (254, 0.5535), (237, 0.5155)),
    (1024, "4096", 2048, 16, 2, "full", (297, 0.6480), (279, 0.6083)),
]
# v5e-256, 1 to 32 slices: (size, tensor, pdbs, remat, [(TFLOP/s, MFU) at 1, 2, 4, 8, 16, 32])
_V5E = [
    (16, 1, 6, "full", [(120, 0.6110), (117, 0.5937), (117, 0.5914), (115, 0.5827),
                        (111, 0.5656), (108, 0.5465)]),
    (32, 1, 4, "full", [(132, 0.6686), (128, 0.6481), (126, 0.6410), (125, 0.6367),
                        (123, 0.6226), (119, 0.6040)]),
    (64, 1, 2, "full", [(118, 0.5990), (112, 0.5666), (110, 0.5585), (108, 0.5496),
                        (105, 0.5329), (99, 0.5018)]),
    # fsdp 16 x tensor 16; remat full at the table's commit (HEAD: qkv_proj_offloaded)
    (128, 16, 1, "full", [(110, 0.5606), (110, 0.5582), (108, 0.5493), (104, 0.5293),
                          (100, 0.5086), (91, 0.4625)]),
]  # fmt: skip
# v4-128 (64 chips), 22B: fsdp 64, pdbs 16, full; one slice (SKIPPED says why not the others).
_V4 = [(1, 156, 0.567)]

_TR2 = (
    "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/trillium/{path}/README.md "
    "(step line logged there); tuning_params: AI-Hypercomputer/maxtext "
    "benchmarks/maxtext_trillium_model_configs.py @e591f30 ({config})"
)


def _v6e(name: str, model: str, chips: int, pdbs: int, remat: Any, step: float, tflops: float,
         path: str, config: str, notes: str) -> dict:  # fmt: skip
    return {
        "name": name,
        "part": 2,
        "hardware": f"tpu-v6e-{chips}",
        "compile_hardware": f"tpu-v6e-{chips}",
        "model": model,
        "preset": "fsdp",
        "overrides": {},
        "train": {"global_batch": pdbs * chips, "remat": remat},
        "compile_batch": pdbs * chips,
        "step_seconds": step,
        "tflops_per_device": tflops,
        "source": _TR2.format(path=path, config=config),
        "notes": notes,
    }


# MaxText's qkv_proj_offloaded: query, key and value projections offloaded, nothing else saved.
QKV_OFFLOADED = {"query": "offload", "key": "offload", "value": "offload"}

RUNS += [
    _mx2023(size, "v5p", slice_name, chips, tensor, pdbs, remat, n, *cells)
    for size, slice_name, chips, tensor, pdbs, remat, *both in _V5P
    for n, cells in zip((1, 2), both, strict=True)
]
RUNS += [
    _mx2023(size, "v5e", "256", 256, tensor, pdbs, remat, n, *cells)
    for size, tensor, pdbs, remat, row in _V5E
    for n, cells in zip((1, 2, 4, 8, 16, 32), row, strict=True)
]
RUNS += [_mx2023(22, "v4", "128", 64, 1, 16, "full", n, t, m) for n, t, m in _V4]
RUNS += [
    _v6e(
        "Llama2-70B v6e-256", "llama2-70b", 256, 2, QKV_OFFLOADED, 9.052, 402.3,
        "Llama2-70B-MaxText", "llama2_70b_4096_sc",
        # the README's tuning_params list pdbs 3; its log's total_weights 2,097,152 = 2 x 4096
        # x 256 tokens [I: docs/facts/production_runs.md]
        "pdbs 2 from the logged total_weights (the README lists 3); fsdp_transpose 256 is this "
        "step's fsdp 256; splash blocks 1024/2048; XLA flags for collective fusion and "
        "SparseCore all-reduce offload",
    ),
    _v6e(
        "GPT3-175B v6e-256", "gpt3-175b", 256, 3, "full", 17.182, 384.9,
        "GPT3-175B-MaxText/bf16", "gpt_3_175b_bf16",
        "MaxText's gpt3 decoder: LayerNorm with biases, learned positions, fused qkv (this step: "
        "RMSNorm, rotary, no biases; the catalogue leaves 0.13% of the weights out); splash "
        "blocks 1024/2048",
    ),
    _v6e(
        "Mistral-7B v6e-8", "mistral-7b", 8, 6, OFFLOAD_8B, 6.320, 432.0,
        "Mistral-7B-MaxText", "mistral_7b",
        "MaxText's mistral-7b attends over the whole sequence (no sliding window); splash blocks "
        "2048, fused backward kernel; XLA flags",
    ),
]  # fmt: skip

# Part two's rows this step cannot state, and why.
SKIPPED = {
    "Gemma3-12B v6e-256, 2x and 4x v6e-256": "sliding-window attention (5 local layers of "
    "window 1024 to 1 global) is no ModelSpec field, and the step attends over the whole "
    "sequence",
    "MaxText-2023 52B v4-384 (1x, 2x)": "the catalogue has no v4 slice of 384 tensorcores (4x4x12)",
    "MaxText-2023 22B 2x, 4x, 8x v4-128 (152, 149, 146 TFLOP/s; MFU 55.2%, 54.3%, 53.2%)": "the "
    "catalogue has no DCN bandwidth for v4 (configs/hardware.toml), which the estimate of a "
    "run across slices needs",
}
