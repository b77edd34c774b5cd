"""The measured pipeline-parallel runs of docs/facts/moe_runs.md (sections 2b, 2c, 2d) as data:
each published run with a pipeline axis, its source, its recipe in this project's terms, what
was measured, and every assumption the recipe needed where the source is silent or the cost
model has no word for what the run did. benchmarks/bench_pipeline_runs.py prices them.

Each run: `id` (moe_runs.md's); `name`; `source`; `hardware` (a catalogue string) and `facts`
(device facts the source states that the catalogue entry lacks, given to the estimate as a
user's `facts=`); `model` (configs/models/<model>.toml, or None with `missing` saying why) and
`seq_len`; `mesh` (MeshConfig's axes, shape and batch axes); `train` (TrainSpec's keyword
arguments); `schedule` (as the run ran it); `measured` ({"tps_per_gpu": ...} tokens a second a
GPU, or {"mfu": ..., "attention_flops": ...} as MaxText states it); `assumptions`.

How a schedule is priced. The cost model prices MaxText's two schedules (docs/design.md section
12): GPipe (`pipeline_repeats` 1) and circular (repeats R > 1: a stage holds R non-adjacent
chunks). 1F1B has GPipe's bubble, (S - 1) / (M + S - 1), and less memory (a stage holds at most
S micro-batches' activations, not M): priced as GPipe, its time is GPipe's and its memory
verdict is GPipe's, not the run's. Interleaved 1F1B (torchtitan's, Megatron's virtual stages
VP) has the circular schedule's bubble, (S - 1) / (M R + S - 1): priced as circular with R
its chunks a stage. A stack the stages x repeats do not divide (LLaMA-3.1 405B's 126 layers
over 8 stages) is pipelined as its last `pipeline_layers`, the most that divide with R as near
the published interleaving as that count allows; the layers before them run with the pipeline
axis acting as data (no bubble; their weights held by every stage). Torchtitan and Megatron cut
the remainder unevenly over the stages instead. These choices are fixed here, by rule, before
any estimate; nothing is fitted to the measured figures.

Micro-batches. Megatron's: the global batch over the micro-batch size and the data-parallel
ranks (world / (TP x PP x CP)), stated by GBS and MBS [I]. Torchtitan's benchmark states none:
its code at the benchmark's commit defaults to the pipeline degree, taken as run.
"""

from __future__ import annotations

from typing import Any

_TT = (
    "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md "
    "({table}; hardware: Grand Teton, H100 96 GB HBM2e at 2.4 TB/s, 500 W, 400 Gb/s RDMA a "
    "GPU); torchtitan @9dec370 torchtitan/parallelisms/pipelining_utils.py (micro-batches "
    "default to pipeline_parallel_degree; a multi-stage schedule gets 2 stages a rank) and "
    "train_configs/llama3_405b.toml (seq_len 8192)"
)
_MB = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987/docs/performance-summary-"
    "archive.md (section {section}, DGX-H100)"
)
_MX = (
    "https://github.com/AI-Hypercomputer/maxtext/blob/e591f30/docs/guides/optimization/"
    "custom_model.md (10T MoE: EP 64 x TP 4 over ICI, pipeline over DCN, 2k tokens a device)"
)

# Assumptions shared by rows.
GRAND_TETON = (
    "Grand Teton H100 (96 GB HBM2e, 500 W) priced as the catalogue's DGX H100 with the source's "
    "2.4 TB/s HBM given as a fact; its peak (989 TFLOP/s, SXM at 700 W: the source says the "
    "500 W part's lies between SXM and NVL) and measured matmul shares are the 700 W part's; "
    "its memory judged against 80 GB, not 96"
)
FP8 = (
    "fp8 linears priced as quantization='fp8': the projections' and MLP matmuls at the fp8 peak "
    "times the calibrated quantized_share (benchmarks/bench_precision.py), their casts "
    "memory-bound; attention, the head and the collectives in bf16, the weights gathered in bf16 "
    "(the run's recipe may gather fp8)"
)
GPIPE_1F1B = (
    "1F1B priced as GPipe: the same bubble (S - 1) / (M + S - 1); GPipe's memory (every "
    "micro-batch's activations held), so the memory verdict is not the run's"
)
INTERLEAVED = (
    "interleaved 1F1B priced as circular with R chunks a stage: the same bubble "
    "(S - 1) / (M R + S - 1); GPipe-like memory"
)
TT_MICRO = (
    "M = 8 micro-batches: not stated; torchtitan's default at the benchmark's commit (the "
    "pipeline degree)"
)
TT_NOTES = "torch.compile and async TP not modelled (the tensor axis's collectives priced as XLA's)"
LAYERS_405B_112 = (
    "pipeline_layers 112 of 126 (the most 8 stages x 2 chunks divide, for T5 and T6 alike so "
    "the pair prices the same stages): the first 14 layers with the pipeline axis as data; "
    "torchtitan splits 126 unevenly (stages of 15-16 layers)"
)
LAYERS_405B_120 = (
    "pipeline_layers 120 of 126 (the most 8 stages divide): the first 6 layers with the "
    "pipeline axis as data; torchtitan splits 126 unevenly (stages of 15-16 layers)"
)
MEGATRON_DP = (
    "Megatron's data parallelism (its distributed optimizer shards Adam's state over it) "
    "priced as plain data parallelism (every replica holds its stage's optimizer state)"
)
MEGATRON_REMAT = (
    "activation recompute not stated: priced with none (Megatron's default, no recompute)"
)
BALANCED = (
    "MoE routing force-balanced and dropless (the source's footnote): moe dropless, routing "
    "balanced"
)


def _tt(
    run_id: str, name: str, table: str, *, seq: int, shape: tuple[int, ...], batch: int,
    repeats: int, layers: int, schedule: str, tps: float, extra: list[str],
) -> dict[str, Any]:  # fmt: skip
    """A torchtitan LLaMA-3.1 405B run on 512 H100s: pipeline 8 x fsdp x seq (CP) x tensor 8
    (TP within a host, as torchtitan lays its mesh out)."""
    axes = ("pipeline", "fsdp", "seq", "model")
    return {
        "id": run_id,
        "name": name,
        "source": _TT.format(table=table),
        "hardware": "gpu-dgx-h100-512",
        "facts": {"hbm_bandwidth": "2400 GB/s"},
        "model": "llama3-405b",
        "seq_len": seq,
        "mesh": {"axes": axes, "shape": shape, "batch": ("fsdp",)},
        "train": {
            "global_batch": batch,
            "remat": "full",
            "pipeline_microbatches": 8,
            "pipeline_repeats": repeats,
            "pipeline_layers": layers,
        },
        "schedule": schedule,
        "measured": {"tps_per_gpu": tps},
        "assumptions": [GRAND_TETON, FP8, TT_MICRO, *extra, TT_NOTES],
    }


_CP = (
    "CP (torchtitan's all-gather rotation, the default at the commit [I]) priced as this "
    "project's sequence axis (keys and values gathered)"
)


def _tt_cp(run_id: str, fsdp: int, cp: int, tps: float) -> dict[str, Any]:
    seq = 32768 * cp
    return _tt(
        run_id, f"torchtitan 405B, 1F1B, FSDP {fsdp} CP {cp}, seq {seq}", "Table 6",
        seq=seq, shape=(8, fsdp, cp, 8), batch=8 * fsdp, repeats=1, layers=120,
        schedule="1F1B", tps=tps,
        extra=[GPIPE_1F1B, LAYERS_405B_120,
               "local batch 8 a data-parallel rank: global batch 8 x FSDP sequences", _CP],
    )  # fmt: skip


def _megatron(
    run_id: str, name: str, section: str, *, hardware: str, model: str | None, seq: int,
    axes: tuple[str, ...], shape: tuple[int, ...], batch_axes: tuple[str, ...], batch: int,
    micro: int, repeats: int, layers: int, schedule: str, tps: float, extra: list[str],
    moe: bool = False, missing: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    train: dict[str, Any] = {
        "global_batch": batch,
        "remat": "none",
        "pipeline_microbatches": micro,
        "pipeline_repeats": repeats,
        "pipeline_layers": layers,
    }
    if moe:
        train |= {"moe": "dropless", "routing": "balanced"}
    run = {
        "id": run_id,
        "name": name,
        "source": _MB.format(section=section),
        "hardware": hardware,
        "facts": {},
        "model": model,
        "seq_len": seq,
        "mesh": {"axes": axes, "shape": shape, "batch": batch_axes},
        "train": train,
        "schedule": schedule,
        "measured": {"tps_per_gpu": tps},
        "assumptions": [*extra, MEGATRON_DP, MEGATRON_REMAT, *([BALANCED] if moe else [])],
    }
    if missing:
        run["missing"] = missing
    return run


_OSS = (
    "no model in the catalogue: GPT-OSS-120B (moe_runs.md section 1 gives its dims) attends "
    "over a sliding window of 128 on alternate layers with attention sinks and biases, which "
    "no ModelSpec field expresses"
)
_EP_OVER_TP = (
    "EP {ep} spans TP 2 x DP {dp} (Megatron's expert-tensor size 1): priced as an expert axis "
    "of {dp} beside the tensor axis of 2, which cuts each expert's d_ff instead"
)

RUNS: list[dict[str, Any]] = [
    _tt("T5", "torchtitan 405B, 1F1B", "Table 5", seq=8192, shape=(8, 8, 1, 8), batch=256,
        repeats=1, layers=112, schedule="1F1B", tps=100.0,
        extra=[GPIPE_1F1B, LAYERS_405B_112,
               "seq 8192: not stated in the benchmark; the 405B train config's"]),
    _tt("T6", "torchtitan 405B, interleaved 1F1B", "Table 5", seq=8192, shape=(8, 8, 1, 8),
        batch=256, repeats=2, layers=112, schedule="interleaved 1F1B, 2 stages a rank",
        tps=128.0,
        extra=[INTERLEAVED + "; R = 2: torchtitan's default for a multi-stage schedule",
               LAYERS_405B_112, "seq 8192: not stated in the benchmark; the 405B train config's"]),
    _tt_cp("T7", 8, 1, 76.0),
    _tt_cp("T8", 4, 2, 47.0),
    _tt_cp("T9", 2, 4, 31.0),
    _tt_cp("T10", 1, 8, 16.0),
    _megatron(
        "G1", "Megatron-Bridge DeepSeek-V3, PP 8 VP 4 EP 64", "25.09",
        hardware="gpu-dgx-h100-1024", model="deepseek-v3", seq=4096,
        axes=("pipeline", "expert", "model"), shape=(8, 64, 2), batch_axes=("expert",),
        batch=8192, micro=128, repeats=7, layers=56, schedule="interleaved 1F1B, VP 4",
        tps=1297.0, moe=True,
        extra=[INTERLEAVED, FP8 + " (the table's H100 fp8 footnote taken to apply)",
               "VP 4 priced as R = 7: 8 stages x 4 chunks divide 32 of the 58 MoE layers; "
               "pipeline_layers 56 (8 x 7 chunks of 1), the 3 dense and first 2 MoE layers "
               "with the pipeline axis as data",
               "M = 128 = GBS 8192 / (MBS 1 x DP 64) (the stated GA 128)",
               "DP 64 with EP 64 carved from it: the expert axis is the batch axis",
               "the multi-token-prediction module not modelled (not in the catalogue model)"],
    ),
    _megatron(
        "G2", "Megatron-Bridge Qwen3-235B, PP 8 VP 4 EP 32, GBS 8192", "26.04.01",
        hardware="gpu-dgx-h100-256", model="qwen3-235b-a22b", seq=4096,
        axes=("pipeline", "expert", "model"), shape=(8, 16, 2), batch_axes=("expert",),
        batch=8192, micro=512, repeats=5, layers=80, schedule="interleaved 1F1B, VP 4",
        tps=1712.0, moe=True,
        extra=[INTERLEAVED, FP8,
               "VP 4 priced as R = 5: 8 x 4 chunks divide 64 of 94 layers; pipeline_layers 80 "
               "(8 x 5 chunks of 2), the first 14 layers with the pipeline axis as data",
               "M = 512 = GBS 8192 / (MBS 1 x DP 16)", _EP_OVER_TP.format(ep=32, dp=16)],
    ),
    _megatron(
        "G3", "Megatron-Bridge Qwen3-235B, PP 8 VP 4 EP 32, GBS 2048", "25.11",
        hardware="gpu-dgx-h100-256", model="qwen3-235b-a22b", seq=4096,
        axes=("pipeline", "expert", "model"), shape=(8, 16, 2), batch_axes=("expert",),
        batch=2048, micro=128, repeats=5, layers=80, schedule="interleaved 1F1B, VP 4",
        tps=1575.0, moe=True,
        extra=[INTERLEAVED, FP8 + " (FP8-CS)",
               "VP 4 priced as R = 5, pipeline_layers 80 (as G2)",
               "M = 128 = GBS 2048 / (MBS 1 x DP 16) (the stated GA 128)",
               _EP_OVER_TP.format(ep=32, dp=16)],
    ),
    _megatron(
        "G4", "Megatron-Bridge GPT-OSS-120B, PP 4 EP 8, GBS 1280", "26.04.01",
        hardware="gpu-dgx-h100-64", model=None, seq=4096,
        axes=("pipeline", "data", "expert"), shape=(4, 2, 8), batch_axes=("data", "expert"),
        batch=1280, micro=80, repeats=1, layers=36, schedule="1F1B (VP n/a)", tps=5824.0,
        moe=True, missing=_OSS,
        extra=[GPIPE_1F1B, "bf16 (stated)", "M = 80 = GBS 1280 / (MBS 1 x DP 16)",
               "DP 16 with EP 8 carved from it: data 2 x expert 8, both batch axes"],
    ),
    _megatron(
        "G5", "Megatron-Bridge GPT-OSS-120B, PP 4 EP 8, GBS 512", "25.11",
        hardware="gpu-dgx-h100-64", model=None, seq=4096,
        axes=("pipeline", "data", "expert"), shape=(4, 2, 8), batch_axes=("data", "expert"),
        batch=512, micro=8, repeats=1, layers=36, schedule="1F1B (VP 1)", tps=5630.0,
        moe=True, missing=_OSS,
        extra=[GPIPE_1F1B, "bf16 (stated)",
               "M = 8 = GBS 512 / (MBS 4 x DP 16) micro-batches of 4 rows; the table's GA 2 "
               "does not follow from its GBS, MBS and DP",
               "DP 16 with EP 8 carved from it: data 2 x expert 8, both batch axes"],
    ),
    _megatron(
        "G7", "Megatron-Bridge LLaMA-3 70B, PP 8 VP 5", "26.04.01",
        hardware="gpu-dgx-h100-64", model="llama3-70b", seq=8192,
        axes=("pipeline", "data", "model"), shape=(8, 2, 4), batch_axes=("data",),
        batch=256, micro=128, repeats=5, layers=80, schedule="interleaved 1F1B, VP 5",
        tps=1664.0,
        extra=[INTERLEAVED + "; R = VP = 5 (80 layers = 8 stages x 5 chunks of 2)", FP8,
               "M = 128 = GBS 256 / (MBS 1 x DP 2)"],
    ),
    _megatron(
        "G8", "Megatron-Bridge LLaMA-3.1 405B, PP 8 VP 8 CP 2", "26.06",
        hardware="gpu-dgx-h100-1024", model="llama3-405b", seq=8192,
        axes=("pipeline", "data", "seq", "model"), shape=(8, 8, 2, 8), batch_axes=("data",),
        batch=1536, micro=192, repeats=5, layers=120, schedule="interleaved 1F1B, VP 8",
        tps=326.0,
        extra=[INTERLEAVED, FP8,
               "VP 8 priced as R = 5: 8 x 8 chunks divide 64 of 126 layers; pipeline_layers "
               "120 (8 x 5 chunks of 3), the first 6 layers with the pipeline axis as data "
               "(Megatron counts the embedding and loss as layers to split 128 evenly)",
               "M = 192 = GBS 1536 / (MBS 1 x DP 8)",
               "CP 2 priced as this project's sequence axis (keys and values gathered; "
               "Megatron's CP passes them round a ring)"],
    ),
]  # fmt: skip


def _maxtext_10t(run_id: str, shape: tuple[int, ...], axes: tuple[str, ...], mfu: float,
                 what: str) -> dict[str, Any]:  # fmt: skip
    return {
        "id": run_id,
        "name": f"MaxText 10T MoE, {what}",
        "source": _MX,
        "hardware": "tpu-v6e-256-16",
        "facts": {},
        "model": None,
        "missing": "no model in the catalogue: the guide's 10T MoE (128 layers, d_model 10240, "
        "64 experts top-2 of d_ff 40960) states no vocabulary or sequence length, and its "
        "config is not in MaxText's history (moe_runs.md 2b)",
        "seq_len": None,
        "mesh": {
            "axes": axes,
            "shape": shape,
            "batch": tuple(a for a in axes if a in ("data", "expert")),
        },
        "train": {"global_batch": None, "pipeline_repeats": 1},
        "schedule": "MaxText GPipe or circular (not stated)",
        "measured": {"mfu": mfu, "attention_flops": "noncausal"},
        "assumptions": [
            "micro-batches, repeats and remat not stated: MaxText's defaults would be M = S "
            "micro-batches, GPipe",
            "MFU pre-causal (the guide predates 2025-07-22): attention counted whole",
            "2k tokens a device: sequence length and per-device batch not separately stated",
        ],
    }


RUNS += [
    _maxtext_10t("D2b", (16, 64, 4), ("pipeline", "expert", "model"), 0.262,
                 "PP 16 over DCN, 16 pods v6e"),
    _maxtext_10t("D2c", (8, 2, 64, 4), ("pipeline", "data", "expert", "model"), 0.24,
                 "PP 8 x DP 2 over DCN, 16 pods v6e"),
]  # fmt: skip

# The fp8 runs carry their precision (TrainSpec.quantization).
for _run in RUNS:
    if any(a.startswith(FP8) for a in _run["assumptions"]):
        _run["train"]["quantization"] = "fp8"

# The pair whose schedules differ with everything else equal: (plain, interleaved, measured
# ratio of their throughputs, interleaved over plain).
SCHEDULE_PAIRS = [("T5", "T6", 128.0 / 100.0)]

# Rows of the facts with a pipeline but no measured figure, and measured rows without a
# pipeline: why each is not a row above.
NOT_ROWS = {
    "D2a (10T MoE, 1 pod, 34.5% MFU)": "no pipeline axis (EP 64 x TP 4 on one pod)",
    "G6 (Qwen3-30B-A3B, 16 H100s)": "no pipeline axis (PP 1, EP 16)",
    "T1-T4 (LLaMA-3.1 8B, FSDP x CP on 8 H100s)": "no pipeline axis",
    "MaxText PR 701 circular pipelining (32B, 4x v4-16)": "the measured step times were not "
    "retrievable (moe_runs.md 2e)",
    "AXLearn gspmd-16B-2x16x8": "a config with no published measurement",
    "gpu-recipes launchers (DeepSeek-V3 PP 16, Qwen3-235B PP 8 VP 4, GPT-OSS-120B PP 4, "
    "Mixtral-8x7B PP 4 VP 8)": "recipes with no published measurement (moe_runs.md 2e)",
}
