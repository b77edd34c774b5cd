"""The calibration set of docs/facts/production_runs.md as data: each published run with the
recipe its source gives, in this project's terms.

Each run: `name`; `hardware` (a hardware string of the catalogue); `compile_hardware` (where
the run spans many DCN-joined slices or hosts whose per-device program is that of one: the
hardware to compile; else the same); `model` (configs/models/<model>.toml); `preset` and
`overrides` (MeshConfig.from_preset(preset, **overrides)); `train` (TrainSpec keyword
arguments; `global_batch` for `hardware`) and `compile_batch` (for `compile_hardware`);
`step_seconds` and `tflops_per_device` as logged (None where the source gives none); `source`;
`notes` (what of the recipe this project's step does not express); GPU runs also
`gpu_mem_fraction`, the share of GPU memory the run's script let jax's client take.

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
