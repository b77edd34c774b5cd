"""Pipeline runs priced: every measured pipeline-parallel run of configs/runs/pipeline.toml
(torchtitan's LLaMA-3.1 405B on 512 H100s, Megatron-Bridge on DGX H100s, MaxText's 10T MoE
statements) through the cost model, the estimate beside the measured figure, the schedule as
priced and every assumption named. Nothing here is fitted to these runs: the calibrations are
the shipped ones (configs/calibration.toml), fitted on runs without a pipeline.

Each run is priced with its own schedule (1F1B, interleaved 1F1B), precision and optimizer
sharding (ZeRO-1 where the run has a data axis). A run the cost model does not price is
printed with the refusal's reason; a run whose model is not in the catalogue says so.

Then the schedule comparison: torchtitan's interleaved 1F1B against its 1F1B (T6 over T5,
measured 1.28x): the estimate's ratio of the two steps, as run where the cost model prices
them, and on a stand-in it prices today (the tensor axis folded into fsdp, the global batch
times its size so each device's rows and micro-batches stay the run's): only the ratio is read
off the stand-in.

    python benchmarks/bench_pipeline_runs.py [--markdown]
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

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.estimate import Estimate
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload import ModelSpec, TrainSpec

PIPELINE = published_runs("pipeline")
RUNS: list[dict[str, Any]] = PIPELINE["runs"]
NOT_ROWS: dict[str, str] = PIPELINE["not_rows"]

# Assumptions many rows share, printed once under the table and named by tag in it.
TAGS = {
    PIPELINE["text"][name]: tag
    for name, tag in (
        ("grand_teton", "A1 grand-teton"),
        ("fp8", "A2 fp8"),
        ("gpipe_1f1b", "A3 1f1b"),
        ("interleaved", "A4 interleaved-1f1b"),
        ("tt_micro", "A5 tt-microbatches"),
        ("tt_notes", "A6 compile/async-tp"),
        ("megatron_dp", "A7 megatron-dp"),
        ("megatron_zero1", "A10 megatron-zero1"),
        ("megatron_remat", "A8 megatron-remat"),
        ("balanced", "A9 balanced-routing"),
    )
}


def by_id(run_id: str) -> dict[str, Any]:
    """The run of that id."""
    return next(r for r in RUNS if r["id"] == run_id)


def _tps(run_id: str) -> float:
    return by_id(run_id)["measured"]["tps_per_gpu"]


# The pairs whose schedules differ with everything else equal: (plain, interleaved, measured
# ratio of their throughputs, interleaved over plain).
SCHEDULE_PAIRS = [
    (plain, inter, _tps(inter) / _tps(plain)) for plain, inter in PIPELINE["schedule_pairs"]
]


def model_of(run: dict[str, Any]) -> ModelSpec:
    """The run's catalogue model at its sequence length; a MeshConfigError for a run whose
    model the catalogue lacks."""
    if "model" not in run:
        raise MeshConfigError(f"run {run['id']}: {run['missing']}")
    return replace(ModelSpec.from_name(run["model"]), seq_len=run["seq_len"])


def price(run: dict[str, Any]) -> Estimate:
    """The run's recipe estimated on its hardware (with the facts its source states)."""
    mesh, hardware = run["mesh"], run["hardware"]
    plan = MeshConfig(mesh["shape"], mesh["axes"], mesh["batch"]).plan(
        simulate_devices(hardware), selector=hardware
    )
    return estimate(plan, model_of(run), TrainSpec(**run["train"]), facts=run["facts"] or None)


def measured_step(run: dict[str, Any], e: Estimate) -> float:
    """The run's step in seconds from what was measured: its tokens over tokens a second a GPU
    times the GPUs; or, from an MFU statement, the FLOPs the trainer counted (MaxText before
    2025-07-22 counted attention whole: the estimate's causal half added again) over MFU
    times the peak."""
    m, devices = run["measured"], math.prod(e.mesh.values())
    tokens = e.global_batch * run["seq_len"]
    if "tps_per_gpu" in m:
        return tokens / (m["tps_per_gpu"] * devices)
    peak = e.model_flops / e.mfu / e.step_seconds
    counted = e.model_flops
    if m["attention_flops"] == "noncausal":
        model = model_of(run)
        width = model.num_heads * model.head_dim * model.num_layers
        counted += tokens / devices * 6 * run["seq_len"] * width
    return counted / (m["mfu"] * peak)


def schedule_text(run: dict[str, Any], e: Estimate | None = None) -> str:
    """The schedule as run and as priced: GPipe, circular, 1F1B or interleaved 1F1B, stages,
    repeats, micro-batches, pipelined layers (and the bubble, where priced); ZeRO-1 named."""
    t = run["train"]
    stages = run["mesh"]["shape"][run["mesh"]["axes"].index("pipeline")]
    repeats, one = t["pipeline_repeats"], t.get("pipeline_schedule") == "1f1b"
    if repeats == 1:
        kind = "1F1B" if one else "GPipe"
    else:
        kind = f"{'interleaved 1F1B' if one else 'circular'} R{repeats}"
    kind += ", ZeRO-1" if t.get("optimizer_over_data") else ""
    micro = t.get("pipeline_microbatches") or "?"
    layers = t.get("pipeline_layers") or "all"
    bubble = f", bubble {e.pipeline.bubble:.1%}" if e is not None and e.pipeline else ""
    return f"{run['schedule']} -> {kind}, S{stages} M{micro}, L_p {layers}{bubble}"


def mesh_text(run: dict[str, Any]) -> str:
    mesh = run["mesh"]
    return " x ".join(f"{a} {n}" for a, n in zip(mesh["axes"], mesh["shape"], strict=True) if n > 1)


def assumption_text(run: dict[str, Any]) -> str:
    return "; ".join(TAGS.get(a, a) for a in run["assumptions"])


def row(run: dict[str, Any]) -> list[str]:
    """One table row: the estimate beside the measured figure, or the refusal's reason."""
    m = run["measured"]
    mfu_row = "mfu" in m
    measured = f"MFU {m['mfu']:.1%}" if mfu_row else f"{m['tps_per_gpu']:g} TPS/GPU"
    head = [f"{run['id']} {run['name']}", run["hardware"], mesh_text(run)]
    try:
        e = price(run)
    except MeshConfigError as err:
        return [*head, schedule_text(run), "-", f"not priced: {err}", measured, "-", "-",
                assumption_text(run)]  # fmt: skip
    logged = measured_step(run, e)
    est = f"MFU {e.mfu:.1%}" if mfu_row else f"{e.tokens_per_second:.0f} TPS/GPU"
    return [*head, schedule_text(run, e), f"{e.step_seconds:.2f}", est,
            f"{measured} ({logged:.2f} s)", f"{e.step_seconds / logged:.2f}", e.verdict,
            assumption_text(run)]  # fmt: skip


def stand_in(run: dict[str, Any]) -> dict[str, Any]:
    """The run on a mesh the cost model prices today beside a pipeline (pipeline, fsdp and
    data axes): every other axis larger than 1 folded into fsdp, the global batch times the
    folded size so each device's rows and micro-batches stay the run's. For ratios only."""
    mesh = run["mesh"]
    keep = ("pipeline", "fsdp", "data")
    sizes = dict(zip(mesh["axes"], mesh["shape"], strict=True))
    folded = math.prod(n for a, n in sizes.items() if a not in keep)
    # a mesh without fsdp gets one where its first folded axis was (a batch axis)
    axes = tuple(dict.fromkeys(a if a in keep else "fsdp" for a in mesh["axes"]))
    shape = tuple(sizes.get(a, 1) * (folded if a == "fsdp" else 1) for a in axes)
    batch = tuple(a for a in axes if a in mesh["batch"] or a == "fsdp")
    train = run["train"] | {"global_batch": run["train"]["global_batch"] * folded}
    return run | {"mesh": {"axes": axes, "shape": shape, "batch": batch}, "train": train,
                  "id": run["id"] + "'"}  # fmt: skip


def schedule_ratio(plain: dict[str, Any], interleaved: dict[str, Any]) -> float:
    """The estimate's step of the plain schedule over the interleaved one's: above 1 when
    interleaving is estimated faster (the measured throughput ratio is this ratio); a
    MeshConfigError where either is not priced."""
    return price(plain).step_seconds / price(interleaved).step_seconds


def comparison() -> list[str]:
    """The schedule comparisons, as run and on the stand-in, one line each."""
    lines = []
    for plain_id, inter_id, measured in SCHEDULE_PAIRS:
        plain, inter = by_id(plain_id), by_id(inter_id)
        what = (f"{inter_id}/{plain_id} ({schedule_text(inter)} against "
                f"{schedule_text(plain)}): measured {measured:.2f}x")  # fmt: skip
        try:
            ratio = schedule_ratio(plain, inter)
            lines.append(f"{what}; estimated as run {ratio:.3f}x ({ratio / measured:.3f} of "
                         "the measured)")  # fmt: skip
        except MeshConfigError as err:
            lines.append(f"{what}; as run not priced: {err}")
        a, b = stand_in(plain), stand_in(inter)
        ratio = schedule_ratio(a, b)
        order = "the same order" if (ratio > 1) == (measured > 1) else "the OPPOSITE order"
        lines.append(
            f"  stand-in priced today ({mesh_text(a)}, global batch "
            f"{a['train']['global_batch']}; {schedule_text(a, price(a))} against "
            f"{schedule_text(b, price(b))}): estimated {ratio:.3f}x, {order} as measured, "
            f"{ratio / measured:.3f} of the measured ratio"
        )
        # how far the ratio rides on the micro-batch count the source does not state
        others = []
        for m in (16, 32):
            ab = [s | {"train": s["train"] | {"pipeline_microbatches": m}} for s in (a, b)]
            others.append(f"M {m}: {schedule_ratio(*ab):.3f}x")
        lines.append(f"  the same stand-in at other micro-batch counts: {', '.join(others)}")
    return lines


def stand_in_row(run: dict[str, Any]) -> list[str] | None:
    """The run's stand-in (`stand_in`) priced beside its measured throughput; None where the
    stand-in is not priced either (MoE layers, or no model)."""
    if "tps_per_gpu" not in run["measured"]:
        return None
    s = stand_in(run)
    try:
        e = price(s)
    except MeshConfigError:
        return None
    tps = run["measured"]["tps_per_gpu"]
    return [s["id"], mesh_text(s), str(s["train"]["global_batch"]), schedule_text(s, e),
            f"{e.step_seconds:.2f}", f"{e.tokens_per_second:.0f}", f"{tps:g}",
            f"{tps / e.tokens_per_second:.2f}"]  # fmt: skip


def print_table(header: list[str], rows: list[list[str]], *, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for cells in rows:
            print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    else:
        for cells in [header, *rows]:
            print(" | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    header = ["run", "hardware", "mesh", "schedule as run -> as priced", "est step s",
              "estimate", "measured (its step)", "est/measured step", "memory verdict",
              "assumptions"]  # fmt: skip
    rows = [row(run) for run in RUNS]
    print_table(header, rows, markdown=args.markdown)
    priced = sum(r[4] != "-" for r in rows)
    print(f"\n{priced} of {len(rows)} runs priced; the rest say why not.")
    stand = [r for r in map(stand_in_row, RUNS) if r is not None]
    print(
        "\nStand-ins priced today, not the runs' meshes (tensor and sequence axes folded into "
        "fsdp, the global batch times their size: each device's rows and micro-batches the "
        "run's; the TP and CP collectives and memory are not the run's):"
    )
    print_table(["stand-in", "mesh", "global batch", "schedule as priced", "est step s",
                 "est TPS/GPU", "measured TPS/GPU", "est/measured step"], stand,
                markdown=args.markdown)  # fmt: skip
    print("\nAssumptions named by tag:")
    for text, tag in TAGS.items():
        print(f"- {tag}: {text}")
    print("\nSchedules compared (throughput of the interleaved over the plain):")
    for line in comparison():
        print(line)
    print("\nFacts rows that are not runs here:")
    for name, why in NOT_ROWS.items():
        print(f"- {name}: {why}")
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
