"""Low-precision runs priced with their precision: every fp8 and int8 run of docs/facts with a
recipe the cost model can state, its estimate with `TrainSpec.quantization` beside the measured
figure (and beside the same recipe priced in bf16), every assumption named.

The one fitted number is `quantized_share` for fp8 on GPU (configs/calibration.toml): the share
of the fp8 peak a quantized projection or MLP matmul reaches, as a fraction of the share of the
bf16 peak the chip's bf16 matmuls reach. `--fit` fits it here on the calibration set alone:
torchtitan's LLaMA-3.1 8B on 128 H100s, bf16 against Float8 (Table 3, 6,514 -> 8,380 TPS/GPU,
1.286x), a grid of 0.50 to 1.44 in steps of 0.01 minimising the error of the estimated gain (on
an H100 the share is given as the chip's measured fp8_matmul_share, its matmul_share times the
ratio). Every other row is judged, not fitted: torchtitan's 8-H100 pair (Table 1, the same recipe
on one host: 1.280x), torchao's 8-B200 pair (1.254x with per-tensor scaling, 1.200x mxfp8),
MaxText's Mixtral int8 on v6e (M2 -> M3: 1.023x; TPU int8 carries the GPU fp8 value, the estimate
says so in `assumes`), and the absolute step of every fp8 and int8 run: torchtitan's T1-T10,
Megatron-Bridge's G-rows, NeMo's LLaMA-2 7B long-sequence curve and M3.

    python benchmarks/bench_precision.py [--fit] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import replace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench_moe_time import load as load_moe
from bench_pipeline_runs import measured_step, price
from bench_time import print_table

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.calibration import quantized_share
from loadax_mesh.cost.estimate import Estimate
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload import ModelSpec, TrainSpec

MOE_RUNS = published_runs("moe")["runs"]
_PIPELINE = published_runs("pipeline")
RUNS = _PIPELINE["runs"]
GRAND_TETON, MEGATRON_DP, MEGATRON_REMAT = (
    _PIPELINE["text"][k] for k in ("grand_teton", "megatron_dp", "megatron_remat")
)

GT = {"hbm_bandwidth": "2400 GB/s"}  # Grand Teton's H100 (GRAND_TETON)
SAC = (
    "per-op selective activation checkpointing priced as remat 'dots' (matmul outputs saved, "
    "norms and activations recomputed; torchtitan's policy also recomputes every other matmul)"
)
TT_FP8 = (
    "torchtitan Float8 (torchao per-tensor dynamic scaling) priced as quantization='fp8' "
    "(absmax current scaling); whether its FSDP gathers ran in fp8 is not stated (priced bf16)"
)
TT = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"
TAO = "https://github.com/pytorch/ao/tree/main/torchao/prototype/mx_formats (B200 training table)"
NEMO = (
    "https://github.com/NVIDIA/NeMo/blob/9421f21/docs/source/performance/"
    "performance_long_sequence.md (LLAMA2-7B, DGX-H100, FP8, NeMo 24.03.01)"
)

# The runs whose bf16 and low-precision steps were both measured, recipe otherwise equal:
# (id, what, hardware, facts, model, seq, mesh shape and axes, global batch, remat,
# quantization, measured bf16 and quantized throughput (or steps for M2 / M3), assumptions,
# in the fit set)
PAIRS: list[dict[str, Any]] = [
    {"id": "TT-128", "name": "torchtitan LLaMA-3.1 8B, 128 H100s, FSDP 128 (Table 3)",
     "hardware": "gpu-dgx-h100-128", "facts": GT, "model": "llama3-8b", "seq": 8192,
     "mesh": ((128,), ("fsdp",)), "batch": 256, "remat": "dots", "quantization": "fp8",
     "measured": (6514.0, 8380.0), "fit": True, "source": TT + " Table 3 (torch.compile)",
     "assumptions": [GRAND_TETON, SAC, TT_FP8]},
    {"id": "TT-8", "name": "torchtitan LLaMA-3.1 8B, 8 H100s, FSDP 8 (Table 1)",
     "hardware": "gpu-dgx-h100-8", "facts": GT, "model": "llama3-8b", "seq": 8192,
     "mesh": ((8,), ("fsdp",)), "batch": 16, "remat": "dots", "quantization": "fp8",
     "measured": (6667.0, 8532.0), "fit": False, "source": TT + " Table 1 (torch.compile)",
     "assumptions": [GRAND_TETON, SAC, TT_FP8]},
    {"id": "TAO-B200", "name": "torchao Llama3-8B, 8 power-limited B200s, FSDP 8, float8 "
     "tensorwise", "hardware": "gpu-dgx-b200-8", "facts": {}, "model": "llama3-8b",
     "seq": 8192, "mesh": ((8,), ("fsdp",)), "batch": 8, "remat": "dots",
     "quantization": "fp8", "measured": (8307.5, 10417.0), "fit": False, "source": TAO,
     "assumptions": ["power-limited B200 (limit not stated) priced at the DGX B200's peak",
                     SAC, "float8 tensorwise with fp8 FSDP gathers (stated): priced with bf16 "
                     "gathers"]},
    {"id": "TAO-B200-mx", "name": "torchao Llama3-8B, 8 power-limited B200s, FSDP 8, "
     "mxfp8_cublas", "hardware": "gpu-dgx-b200-8", "facts": {}, "model": "llama3-8b",
     "seq": 8192, "mesh": ((8,), ("fsdp",)), "batch": 8, "remat": "dots",
     "quantization": "fp8", "measured": (8307.5, 9969.0), "fit": False, "source": TAO,
     "assumptions": ["power-limited B200 (limit not stated) priced at the DGX B200's peak",
                     SAC, "mxfp8 (1 x 32 blocks of e8m0 scales) priced as per-tensor absmax "
                     "fp8; communication in bf16 (stated)"]},
]  # fmt: skip

# The estimate-only figures issue 52 asks for ("done when").
DONE_WHEN = [
    ("LLaMA-3 8B, 8 H100s (gpu-p5.48xlarge-8), FSDP 8, seq 8192, 16 x 8192, dots",
     "gpu-p5.48xlarge-8", "llama3-8b", ((8,), ("fsdp",)), 16, "dots", "fp8"),
    ("LLaMA-3 8B, 8 H100s (gpu-p5.48xlarge-8), FSDP 8, seq 8192, 16 x 8192, full remat",
     "gpu-p5.48xlarge-8", "llama3-8b", ((8,), ("fsdp",)), 16, "full", "fp8"),
    ("LLaMA-3 8B, v5p-8 (4 chips), FSDP 4, 16 x 8192, full remat",
     "tpu-v5p-8", "llama3-8b", ((4,), ("fsdp",)), 16, "full", "int8"),
    ("LLaMA-3 70B, v5p-128 (64 chips), FSDP 64, 64 x 8192, full remat",
     "tpu-v5p-128", "llama3-70b", ((64,), ("fsdp",)), 64, "full", "int8"),
]  # fmt: skip

# The rows of the facts with a low precision that are not priced here, and why.
NOT_PRICED = {
    "G6 Qwen3-30B-A3B FP8, 16 H100s (moe_runs.md 2d)": "no model in the catalogue",
    "NeMo LLaMA2-7B 4k, 4 GPUs (low_precision.md 4)": "4 GPUs are not whole DGX H100 hosts",
    "NeMo LLAMA3-8B on DGX-B200, FP8 (low_precision.md 4)": "in every row TP x PP x DP x CP "
    "is a quarter of the GPU count: the layout is not recoverable",
    "torchtitan Llama4 Scout MXFP8 on GB200 (low_precision.md 3.1)": "mxfp8 on the routed "
    "experts alone (TrainSpec.quantization quantizes every projection), and the node count and "
    "the chip count of the source disagree",
    "Megatron-Bridge DeepSeek-V3 FP8-MX on 256 GB300 / GB200 (low_precision.md 3.1)": "GB300 "
    "is not in the catalogue; the GB200 pair changes the pipeline with the precision",
    "GPT-3 175B int8 on v5p-1024": "not in docs/facts (production_runs.md has GPT-3 175B in "
    "bf16 on v6e-256 only)",
}


def plan_of(hardware: str, shape: tuple[int, ...], axes: tuple[str, ...], batch=None):
    batch_axes = batch or tuple(a for a in axes if a in ("data", "fsdp"))
    return MeshConfig(shape, axes, batch_axes).plan(simulate_devices(hardware), selector=hardware)


def priced(row: dict[str, Any], quantization: str, facts: dict | None = None) -> Estimate:
    """A pair's recipe estimated at `quantization` (`facts` added to the row's)."""
    shape, axes = row["mesh"]
    model = replace(ModelSpec.from_name(row["model"]), seq_len=row["seq"])
    train = TrainSpec(global_batch=row["batch"], remat=row["remat"], quantization=quantization)
    given = {**row["facts"], **(facts or {})}
    return estimate(plan_of(row["hardware"], shape, axes), model, train, facts=given or None)


def gain(row: dict[str, Any], share: float | None = None) -> float:
    """The estimated bf16 step over the quantized one; `share`: the ratio `quantized_share`
    in place of the shipped one (given as the chip's measured share)."""
    facts = None
    if share is not None:
        own = hardware_profile(row["hardware"]).facts().matmul_share
        assert own is not None, f"{row['hardware']}: no measured bf16 matmul share to scale"
        facts = {f"{row['quantization']}_matmul_share": own * share}
    bf16 = priced(row, "none").step_seconds
    return bf16 / priced(row, row["quantization"], facts).step_seconds


def fit() -> float:
    """The ratio minimising the fit set's error of the estimated gain."""
    grid = [round(0.5 + k / 100, 2) for k in range(95)]
    rows = [r for r in PAIRS if r["fit"]]
    loss = [sum((gain(r, s) / (r["measured"][1] / r["measured"][0]) - 1) ** 2 for r in rows)
            for s in grid]  # fmt: skip
    return grid[loss.index(min(loss))]


def pair_rows() -> list[list[str]]:
    out = []
    for r in PAIRS:
        shape = r["mesh"][0]
        bf16, low = priced(r, "none"), priced(r, r["quantization"])
        tokens = r["batch"] * r["seq"] / math.prod(shape)
        steps = [tokens / tps for tps in r["measured"]]
        est, meas = bf16.step_seconds / low.step_seconds, r["measured"][1] / r["measured"][0]
        out.append([
            r["id"] + (" (fit set)" if r["fit"] else ""), r["hardware"], r["quantization"],
            f"{bf16.step_seconds:.3f} / {steps[0]:.3f}", f"{low.step_seconds:.3f} / {steps[1]:.3f}",
            f"{est:.3f}", f"{meas:.3f}", f"{est / meas - 1:+.1%}", "; ".join(r["assumptions"]),
        ])  # fmt: skip
    m2, m3 = (load_moe(s) for s in MOE_RUNS if s["name"].split()[0] in ("M2", "M3"))
    est = m2.shipped.step_seconds / m3.shipped.step_seconds
    meas = m2.logged / m3.logged
    out.append([
        "M2 -> M3", m3.spec["hardware"], "int8",
        f"{m2.shipped.step_seconds:.3f} / {m2.logged:.3f}",
        f"{m3.shipped.step_seconds:.3f} / {m3.logged:.3f}", f"{est:.3f}", f"{meas:.3f}",
        f"{est / meas - 1:+.1%}", "MaxText Mixtral 8x7B dropping (moe_runs.md M2, M3); "
        "TPU int8 at the GPU fp8 value (carried, `assumes`); M2 and M3 logged 3 weeks apart "
        "on different libtpu builds",
    ])  # fmt: skip
    return out


def _tt2(run_id: str, fsdp: int, cp: int, tps: float) -> dict[str, Any]:
    """torchtitan Table 2: LLaMA-3.1 8B on 8 H100s, FSDP x CP, local batch 1, full AC, Float8."""
    return {
        "id": run_id, "name": f"torchtitan 8B, FSDP {fsdp} CP {cp}, seq {32768 * cp}",
        "hardware": "gpu-dgx-h100-8", "facts": GT, "model": "llama3-8b", "seq_len": 32768 * cp,
        "mesh": {"axes": ("fsdp", "seq"), "shape": (fsdp, cp), "batch": ("fsdp",)},
        "train": {"global_batch": fsdp, "remat": "full", "quantization": "fp8"},
        "measured": {"tps_per_gpu": tps},
        "assumptions": [GRAND_TETON, TT_FP8, "CP (all-gather rotation) priced as this project's "
                        "sequence axis"],
    }  # fmt: skip


def _nemo(seq: int, gpus: int, gbs: int, tp: int, pp: int, dp: int, cp: int, tflops: float):
    """NeMo's LLaMA-2 7B long-sequence row on DGX H100s (FP8), its with-CP layout."""
    shape = tuple(n for n in (pp, dp, cp, tp))
    axes = ("pipeline", "data", "seq", "model")
    keep = [k for k, n in enumerate(shape) if n > 1] or [1]
    train = {"global_batch": gbs, "remat": "none", "quantization": "fp8"}
    if pp > 1:  # MBS 1: the replica's rows, one a micro-batch
        train |= {"pipeline_microbatches": gbs // dp, "pipeline_repeats": 1}
    else:
        train["microbatches"] = gbs // dp
    return {
        "id": f"NM-{seq // 1024}k", "name": f"NeMo LLaMA-2 7B, seq {seq}, TP{tp} PP{pp} DP{dp} "
        f"CP{cp}", "hardware": f"gpu-dgx-h100-{gpus}", "facts": {}, "model": "llama2-7b",
        "seq_len": seq,
        "mesh": {"axes": tuple(axes[k] for k in keep), "shape": tuple(shape[k] for k in keep),
                 "batch": ("data",) if dp > 1 else ()},
        "train": train, "measured": {"model_tflops": tflops},
        "assumptions": ["MBS 1 (not stated)", MEGATRON_REMAT, MEGATRON_DP,
                        "NeMo's model TFLOP/s read as this project's model FLOPs (causal "
                        "attention); its attention count is not stated"],
    }  # fmt: skip


ABSOLUTE: list[dict[str, Any]] = [
    _tt2("T1", 8, 1, 3890.0), _tt2("T2", 4, 2, 2540.0), _tt2("T3", 2, 4, 1071.0),
    _tt2("T4", 1, 8, 548.0),
    *[r for r in RUNS if r["train"].get("quantization", "none") != "none"],
    _nemo(8192, 8, 512, 1, 2, 4, 1, 730.0), _nemo(16384, 16, 256, 2, 1, 8, 1, 660.0),
    _nemo(32768, 32, 128, 2, 1, 8, 2, 610.0), _nemo(65536, 64, 64, 4, 1, 8, 2, 574.0),
    _nemo(131072, 128, 32, 4, 1, 8, 4, 555.0), _nemo(262144, 256, 16, 4, 1, 8, 8, 549.0),
    _nemo(524288, 512, 8, 8, 1, 4, 16, 549.0), _nemo(1048576, 1024, 4, 8, 1, 4, 32, 536.0),
]  # fmt: skip


def absolute_row(run: dict[str, Any]) -> list[str]:
    m = run["measured"]
    head = [f"{run['id']} {run['name']}", run["hardware"], run["train"]["quantization"]]
    bf16_run = run | {"train": run["train"] | {"quantization": "none"}}
    try:
        e, b = price(run), price(bf16_run)
    except MeshConfigError as err:
        return [*head, "-", "-", "-", "-", "-", "-", f"not priced: {err}"]
    if "model_tflops" in m:
        logged = e.model_flops / (m["model_tflops"] * 1e12)
        measured = f"{m['model_tflops']:g} TFLOP/s"
    else:
        logged = measured_step(run, e)
        measured = f"{m['tps_per_gpu']:g} TPS/GPU"
    return [*head, f"{e.step_seconds:.2f}", f"{b.step_seconds:.2f}", f"{measured} "
            f"({logged:.2f} s)", f"{e.step_seconds / logged:.2f}", f"{b.step_seconds / logged:.2f}",
            e.verdict, "; ".join(run["assumptions"])]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit quantized_share on the fit set")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    shipped = quantized_share("gpu", "fp8")
    if args.fit:
        print(f"gpu fp8: quantized_share {fit()} (fit set: "
              f"{', '.join(r['id'] for r in PAIRS if r['fit'])}); shipped {shipped}")  # fmt: skip
    print(f"Gains, bf16 step over low-precision step (quantized_share gpu fp8 {shipped}, "
          f"tpu int8 {quantized_share('tpu', 'int8')}):")  # fmt: skip
    print_table(["pair", "hardware", "precision", "bf16 step s est / measured",
                 "low-precision step s est / measured", "est gain", "measured gain",
                 "gain error", "assumptions"], pair_rows(), markdown=args.markdown)  # fmt: skip
    print("\nDone-when figures (estimates):")
    for what, hw, model, (shape, axes), batch, remat, q in DONE_WHEN:
        seq = ModelSpec.from_name(model).seq_len
        row = {"hardware": hw, "facts": {}, "model": model, "mesh": (shape, axes), "seq": seq,
               "batch": batch, "remat": remat}  # fmt: skip
        b, lo = priced(row, "none"), priced(row, q)
        ratio = b.step_seconds / lo.step_seconds
        print(f"- {what}: bf16 {b.step_seconds:.3f} s, {q} {lo.step_seconds:.3f} s, gain "
              f"{ratio:.3f} ({q} step / bf16 step {1 / ratio:.3f}); {q} memory "
              f"{lo.memory_bytes / 1e9:.1f} GB (quantized copies "
              f"{lo.terms.get('quantized', 0) / 1e9:.2f} GB) against bf16 "
              f"{b.memory_bytes / 1e9:.1f} GB" + (f"; assumes: {lo.assumes[0]}" if lo.assumes
                                                  else ""))  # fmt: skip
    print("\nEvery fp8 and int8 run re-priced with its precision (estimate beside measured):")
    rows = [absolute_row(r) for r in ABSOLUTE]
    m2, m3 = (load_moe(s) for s in MOE_RUNS if s["name"].split()[0] in ("M2", "M3"))
    est, bf16 = m3.shipped.step_seconds, m2.shipped.step_seconds  # M2: M3's recipe in bf16
    rows.append([m3.spec["name"], m3.spec["hardware"], "int8", f"{est:.2f}", f"{bf16:.2f}",
                 f"{m3.logged:.3f} s logged", f"{est / m3.logged:.2f}", f"{bf16 / m3.logged:.2f}",
                 m3.shipped.verdict, "M2's recipe with quantization=int8; TPU int8 at the GPU "
                 "fp8 value (carried); permute_bandwidth does not apply (dropping)"])  # fmt: skip
    print_table(["run", "hardware", "precision", "est step s", "est bf16 step s",
                 "measured (its step)", "est/measured", "bf16 est/measured", "memory verdict",
                 "assumptions"], rows, markdown=args.markdown)  # fmt: skip
    print("\nLow-precision rows of the facts not priced:")
    for name, why in NOT_PRICED.items():
        print(f"- {name}: {why}")
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
