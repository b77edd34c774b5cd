"""The cost model against the compiler: estimate and compiled step side by side.

For each case the plan is made on the compile-only devices (libtpu for TPU, XLA's CUDA client
for GPU), `estimate` reads it, and `compile_step` compiles the reference step for it. Printed:
memory per device (estimate / compiled: on GPU `memory_analysis()`'s sum, the allocator's peak;
on TPU what libtpu's buffer assignment gives the program, which its HBM check counts, with the
sum beside it; where the TPU compiler refuses, the step as written, and beside it the figure
its own extra remat squeezed it to), host memory where the recipe offloads
(estimate / the compiler's host temp bytes), whether both say it fits, and per mesh
axis the collective bytes per step (estimate / compiled). Collectives the compiler runs over
several axes at once join those axes into one row. GPU rows also compare the bytes that cross
granules (NVLink domains). Targets: memory and host memory within 20%, fits agreeing, bytes
within 25%.

    python benchmarks/bench_cost.py [--cache DIR] [--only SUBSTRING] [--recipes] [--markdown]
        [--rows configs/memory_referees.toml] [--cached] [--show-rows configs/memory_referees.toml]

`--cache DIR` keeps each compile report as JSON and reuses it (compiles take minutes here);
`--cached` runs only the cases it already holds.
`--rows FILE` writes each case's estimated and compiled memory as the referee rows the fit
verdict's error band is read from (cost/band.py); `--refresh-rows FILE` recomputes their
estimates alone; `--show-rows FILE` prints them as a table, the estimates as the model gives them
now (no compile: benchmarks/RESULTS.md's memory table).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.spec import parse_remat

# (hardware, preset with optional overrides "preset:axis=size", model, global batch, remat
# [, microbatches, logits chunks[, pipeline microbatches, pipeline repeats[, pipeline
# remat]]]); remat as the
# command line writes it; the model a catalogue name, with field overrides after a colon
# ("maxtext-2023-16b:num_layers=4": fewer layers, to compile in a minute)
MAXTEXT_8B = "layer_input=offload,query=offload,key=offload,value=offload,out_proj=offload"
MAXTEXT_70B = "layer_input=offload,query=offload,key=offload,value=offload"
MOE_SMALL = (
    "mixtral-8x7b:num_layers=2,d_model=1024,d_ff=2048,moe_d_ff=2048,num_heads=8,num_kv_heads=8,"
    "seq_len=1024"
)
MIXTRAL = "mixtral-8x7b:seq_len=4096"
# DeepSeek-V3's layers shrunk the same way: a dense layer then a MoE layer, latent attention
# with its own head dims (8 heads of 128 + 64, values 128) and smaller ranks, 32 experts of
# width 512, 8 a token, a shared one; a vocabulary of 32768, so that the layers, not the
# logits, set the peak
MLA_SMALL = (
    "deepseek-v3:num_layers=2,first_dense_layers=1,d_model=1024,d_ff=2048,num_heads=8,"
    "num_kv_heads=8,q_lora_rank=512,kv_lora_rank=256,num_experts=32,experts_per_token=8,"
    "moe_d_ff=512,vocab_size=32768,seq_len=1024"
)
DEEPSEEK_RECIPE = "layer_input=offload,out_proj=offload"
# Mixtral's shrunk MoE layers, four of them, for two pipeline stages of two MoE layers
MOE_PIPE = MOE_SMALL.replace("num_layers=2", "num_layers=4")
# ... and at Mixtral's own width (its layers, experts and sequence), four layers
MOE_PIPE_WIDE = "mixtral-8x7b:num_layers=4,seq_len=4096"
CASES: list[tuple[Any, ...]] = [
    ("tpu-v5litepod-8", "fsdp", "tiny", 64, "full"),
    ("tpu-v5litepod-8", "fsdp_tp", "tiny", 64, "dots"),
    ("tpu-v5p-16", "dp_sp", "tiny", 32, "none"),
    ("tpu-v6e-64", "fsdp", "llama2-7b", 64, "full"),
    ("tpu-v5p-128", "fsdp", "llama3-8b", 64, "full"),
    ("tpu-v5p-128", "fsdp", "llama3-8b", 64, "dots"),
    ("tpu-v5p-128", "fsdp_tp", "llama3-8b", 64, "full"),
    ("tpu-v5litepod-256", "fsdp", "llama3-8b", 256, "full"),
    ("tpu-v5litepod-256-2", "fsdp", "llama3-8b", 512, "full"),
    ("tpu-v5litepod-8", "fsdp", "llama3-8b", 8, "full"),
    ("tpu-v5p-1024", "fsdp", "llama3-70b", 512, "full"),
    ("tpu-v5p-1024", "fsdp_tp", "llama3-70b", 512, "full"),
    ("tpu-v5litepod-256", "fsdp", "llama3-70b", 256, "full"),
    ("gpu-p5.48xlarge-16", "fsdp", "tiny", 64, "full"),
    ("gpu-p5.48xlarge-16", "hsdp", "llama3-8b", 16, "full"),
    ("gpu-p5.48xlarge-64", "fsdp", "llama3-8b", 64, "full"),
    ("gpu-p5.48xlarge-512", "fsdp_tp", "llama3-70b", 512, "full"),
    ("gpu-p4de.24xlarge-32", "fsdp", "llama2-7b", 32, "full"),
    ("gpu-a4-highgpu-8g-16", "hsdp", "llama3-8b", 32, "full"),
    ("gpu-a4x-highgpu-4g-144", "fsdp_tp:fsdp=2", "llama3-70b", 144, "full"),
    # The recipe: offload, micro-batches, chunked logits (issue #20)
    ("tpu-v6e-8", "fsdp", "llama3-8b", 24, MAXTEXT_8B, 1, 1),
    ("tpu-v6e-8", "fsdp", "llama3-8b", 24, "offload", 3, 1),
    ("tpu-v6e-64", "fsdp", "llama3-70b", 128, MAXTEXT_70B, 1, 1),
    ("tpu-v5p-128", "fsdp", "llama3-8b", 256, "full", 2, 1),
    ("tpu-v5p-128", "fsdp", "llama3-8b", 256, "layer_input=offload,query=device", 1, 4),
    ("tpu-v5litepod-256", "fsdp", "llama3-8b", 512, "full", 2, 1),
    ("tpu-v5litepod-256", "fsdp", "llama3-8b", 512, "full", 1, 4),
    ("tpu-v6e-8", "fsdp", "llama3-8b", 24, "dots", 3, 16),
    ("gpu-a3-highgpu-8g-8", "fsdp", "llama2-7b", 32, "offload", 2, 1),
    ("gpu-p5.48xlarge-16", "hsdp", "llama3-8b", 32, "dots", 2, 4),
    # No remat (what autodiff saves), and choose_mesh's 70B winners on v5p-1024 before and after
    ("tpu-v5p-1024", "mesh:fsdp=128,seq=4", "llama3-70b", 512, "none", 4, 1),
    ("tpu-v5p-1024", "mesh:fsdp=256,seq=2", "llama3-70b", 512, "dots", 2, 1),
    ("gpu-p5.48xlarge-8", "fsdp", "llama3-8b", 8, "none", 1, 1),
    # Every named tensor on the device (MaxText's minimal_flash): the A3 runs' recipe, and
    # choose_mesh's winners for 70B on v5p-1024 and the 8B tpu-recipes runs' v6e-32 and v6e-16
    ("gpu-p5.48xlarge-16", "hsdp", "llama3-8b", 32, "dots_attention", 2, 1),
    ("tpu-v5p-1024", "mesh:fsdp=256,seq=2", "llama3-70b", 512, "dots_attention", 2, 1),
    ("tpu-v6e-32", "mesh:fsdp=16,seq=2", "llama3-8b", 96, "dots_attention", 6, 1),
    ("tpu-v6e-16", "mesh:fsdp=8,model=2", "llama3-8b", 48, "dots_attention", 6, 1),
    # The residual stream cut over the tensor axis: the plain step's best for 8B on v5e-256
    ("tpu-v5litepod-256", "mesh:fsdp=128,model=2", "llama3-8b", 512, "full", 1, 1),
    # choose_mesh's 405B pick on a full v5p pod (bench_choose): tensor 8 beside data over DCN
    ("tpu-v5p-17920", "mesh:data=35,fsdp=32,model=8", "llama3-405b", 4480, "dots_attention", 4, 1),
    # MaxText's 2023 models (ReLU two-matrix MLP, MHA with head_dim 256, tied embeddings) as
    # its v5e and v5p tables ran them, layers cut: 16B on v5e-256 (pdbs 6, full) and on 2
    # slices; 32B on v5p-128 (fsdp 16 x tensor 4, pdbs 8, "minimal" = dots)
    ("tpu-v5litepod-256", "fsdp", "maxtext-2023-16b:num_layers=4", 1536, "full"),
    ("tpu-v5litepod-256-2", "fsdp", "maxtext-2023-16b:num_layers=4", 3072, "full"),
    ("tpu-v5p-128", "mesh:fsdp=16,model=4", "maxtext-2023-32b:num_layers=2", 512, "dots"),
    # full remat over a tensor axis, at full size (every layer; about 4 minutes here): 128B on
    # v5e-256 as its table ran it (fsdp 16 x tensor 16, pdbs 1)
    ("tpu-v5litepod-256", "mesh:fsdp=16,model=16", "maxtext-2023-128b", 256, "full"),
    # Mixtral's MoE layers shrunk to compile in minutes (2 layers, d_model 1024, 8 experts of
    # width 2048, 2 a token): experts over an expert axis (all-to-all) and over fsdp alone
    ("tpu-v5p-16", "fsdp_ep", MOE_SMALL, 16, "full"),
    ("tpu-v5p-16", "fsdp", MOE_SMALL, 16, "full"),
    # Mixtral 8x7B whole (32 layers), 4096-token sequences, full remat (MaxText's v5p recipe):
    # 4 a device over an expert axis of 8, and experts on fsdp 64 (MaxText's ici_fsdp=-1); on
    # two 8-GPU H100 hosts, 2 a device with the expert axis inside each host's NVLink
    ("tpu-v5p-128", "fsdp_ep:expert=8", MIXTRAL, 256, "full"),
    ("tpu-v5p-128", "fsdp", MIXTRAL, 256, "full"),
    ("gpu-p5.48xlarge-16", "fsdp_ep", MIXTRAL, 32, "full"),
    # DeepSeek-V3's shrunk: experts on fsdp (its published recipe's layout) under full remat
    # and under its recipe's offload, and over an expert axis
    ("tpu-v5p-16", "fsdp", MLA_SMALL, 32, "full"),
    ("tpu-v5p-16", "fsdp", MLA_SMALL, 32, DEEPSEEK_RECIPE),
    ("tpu-v5p-16", "fsdp_ep", MLA_SMALL, 32, "full"),
    # choose_mesh's DeepSeek-V3 pick on v5p-1024 at full width, 4 layers (3 dense, 1 MoE):
    # fsdp 512 as the published recipe, the 256 experts' d_model over it
    ("tpu-v5p-1024", "fsdp", "deepseek-v3:num_layers=4", 3072, "offload"),
    # Pipeline stages (issue 43): LLaMA-3 8B whole in 4 stages over v5p-128, GPipe and two
    # repeats (circular), 4 micro-batches; on two 8-GPU H100 hosts, 2 stages (a host each)
    # over fsdp 8, GPipe, cuDNN attention inside the stages
    ("tpu-v5p-128", "mesh:pipeline=4,fsdp=16", "llama3-8b", 64, "full", 1, 1, 0, 1),
    ("tpu-v5p-128", "mesh:pipeline=4,fsdp=16", "llama3-8b", 64, "full", 1, 1, 0, 2),
    # MaxText's remat: one checkpoint an iteration (bench_maxtext's GPipe and circular rows)
    ("tpu-v5p-128", "mesh:pipeline=4,fsdp=16", "llama3-8b", 64, "full", 1, 1, 0, 1, "iteration"),
    ("tpu-v5p-128", "mesh:pipeline=4,fsdp=16", "llama3-8b", 64, "full", 1, 1, 0, 2, "iteration"),
    ("gpu-p5.48xlarge-16", "mesh:pipeline=2,fsdp=8", "llama3-8b", 16, "full", 1, 1, 0, 1),
    (
        "gpu-p5.48xlarge-16",
        "mesh:pipeline=2,fsdp=8",
        "llama3-8b",
        16,
        "full",
        1,
        1,
        0,
        2,
        "iteration",
    ),
    # ... beside a tensor axis (the residual stream cut over it in every stage) and beside a
    # sequence axis
    ("tpu-v5p-128", "mesh:pipeline=2,fsdp=8,model=4", "llama3-8b", 64, "full", 1, 1, 0, 1),
    ("tpu-v5p-128", "mesh:pipeline=4,fsdp=4,model=4", "llama3-8b", 64, "full", 1, 1, 0, 1),
    ("tpu-v5p-128", "mesh:pipeline=2,fsdp=8,seq=4", "llama3-8b", 64, "full", 1, 1, 0, 1),
    # ... MoE layers in the stages, their experts over an expert axis beside fsdp
    ("tpu-v5p-16", "mesh:pipeline=2,fsdp=2,expert=2", MOE_PIPE, 16, "full", 1, 1, 0, 1),
    ("tpu-v5p-16", "mesh:pipeline=2,fsdp=2,expert=2", MOE_PIPE_WIDE, 16, "full", 1, 1, 0, 1),
]
TARGETS = {"memory": 0.20, "bytes": 0.25}


def compiled(case: tuple[Any, ...], plan: Any, cache: Path | None) -> dict[str, Any]:
    """The compile report of a case as plain data (from the cache when it has it)."""
    from loadax_mesh.compiler.report import compile_step

    path = None if cache is None else cache_path(cache, case)
    if path is not None and path.exists():
        return json.loads(path.read_text())
    report = compile_step(plan, model_of(case), train_of(case)).to_dict()
    if path is not None:
        path.write_text(json.dumps(report))
    return report


def cache_path(cache: Path, case: tuple[Any, ...]) -> Path:
    """Where a case's compile report is kept: its fields joined, a long name cut and hashed
    (a file name holds at most 255 bytes)."""
    name = "_".join(map(str, case))
    if len(name) > 200:
        name = name[:160] + "-" + hashlib.sha1(name.encode()).hexdigest()[:16]
    return cache / (name + ".json")


def model_of(case: tuple[Any, ...]) -> ModelSpec:
    """A case's model: the catalogue's, with the integer fields written after a colon."""
    name, _, overrides = case[2].partition(":")
    fields = {k: int(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
    return replace(ModelSpec.from_name(name), **fields)


def train_of(case: tuple[Any, ...]) -> TrainSpec:
    """A case's TrainSpec: its batch and recipe (micro-batches and chunks 1 where not given),
    and its pipeline's micro-batches, repeats and remat where given."""
    batch, remat, *recipe = case[3:]
    micro, chunks, *pipeline = recipe or (1, 1)
    names = ("pipeline_microbatches", "pipeline_repeats", "pipeline_remat")
    stages = dict(zip(names, pipeline, strict=False))
    return TrainSpec(
        global_batch=batch,
        remat=parse_remat(remat),
        microbatches=micro,
        logits_chunks=chunks,
        **stages,
    )


def recipe_text(case: tuple[Any, ...]) -> str:
    """The recipe column: remat, and micro-batches x and logits chunks / where not 1."""
    t = train_of(case)
    text = t.remat_text.replace("layer_input", "in").replace("=offload", "=off")
    text += f" x{t.microbatches}" * (t.microbatches > 1)
    text += f" /{t.logits_chunks}" * (t.logits_chunks > 1)
    text += f" pp R{t.pipeline_repeats}" * (len(case) > 7)
    return text + " per iteration" * (t.pipeline_remat == "iteration")


def config(preset: str) -> MeshConfig:
    """A preset, with overrides written after a colon (an NVL72 rack's 72 GPUs divide no
    d_model by themselves: fsdp_tp:fsdp=2 puts tp 4 x fsdp 2 in a rack, data on the rest);
    or `mesh:` and the axes with their sizes, data and fsdp the batch axes (what choose_mesh
    names: mesh:fsdp=128,seq=4)."""
    name, _, overrides = preset.partition(":")
    sizes = {k: int(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
    if name == "mesh":
        batch = tuple(a for a in sizes if a in ("data", "fsdp", "expert"))
        return MeshConfig(
            mesh_shape=tuple(sizes.values()), mesh_axis_names=tuple(sizes), batch_axis_names=batch
        )
    return MeshConfig.from_preset(name, **sizes)


def clusters(report: dict[str, Any], axes: list[str]) -> list[tuple[str, ...]]:
    """Axes joined where the compiler runs a collective over several of them at once (more
    than 1% of its bytes): each such set is compared as one row."""
    total = sum(c["bytes"] * c["count"] for c in report["collectives"]) or 1
    groups = [{a} for a in axes]
    for c in report["collectives"]:
        spans = set(c["spans"])
        if len(spans) > 1 and c["bytes"] * c["count"] > 0.01 * total:
            joined = [g for g in groups if g & spans]
            groups = [g for g in groups if not g & spans] + [set().union(*joined, spans)]
    return [tuple(a for a in axes if a in g) for g in groups]


def compare(case: tuple[Any, ...], cache: Path | None) -> dict[str, Any]:
    hardware, preset = case[:2]
    plan = config(preset).plan(topology_devices(hardware))
    est = estimate(plan, model_of(case), train_of(case))
    start = time.perf_counter()
    report = compiled(case, plan, cache)
    rows = []
    refused = report.get("message") is not None  # the compiler refused: no program to read
    for group in [] if refused else clusters(report, list(plan.axis_names)):
        mine = [c for c in report["collectives"] if c["spans"] and set(c["spans"]) <= set(group)]
        got = sum(c["bytes"] * c["count"] for c in mine)
        want = sum(est.axes[a].bytes for a in group)
        across = sum((c.get("across_granules") or 0) * c["count"] for c in mine)
        want_across = sum(est.axes[a].across_granules for a in group)
        if got or want:
            rows.append((",".join(group), want, got, want_across, across))
    return {
        "case": case,
        "mesh": "x".join(f"{k}{v}" for k, v in plan.shape.items() if v > 1),
        "memory": (est.memory_bytes, report.get("assigned_bytes") or report["total_bytes"]),
        "sum": report["total_bytes"] if report.get("assigned_bytes") else None,
        "host": (est.host_bytes, report.get("host_bytes") or 0),
        "fits": (est.fits, report["fits"]),
        "squeezed": report.get("squeezed_bytes"),
        "axes": rows,
        "gpu": hardware.startswith("gpu"),
        "seconds": time.perf_counter() - start,
        "plan": plan,
        # a pipelined case: the compiled roofline is to be no longer than the estimated step
        "roofline": (est.step_seconds, report.get("roofline_seconds")) if est.pipeline else None,
    }


def referee_row(case: tuple[Any, ...], plan: Any, want: int, got: int) -> dict[str, Any]:
    """A case as a row of configs/memory_referees.toml (cost/band.py reads and recomputes it)."""
    name, _, overrides = case[2].partition(":")
    fields = {k: int(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
    t = train_of(case)
    return {
        "hardware": case[0],
        "axes": list(plan.axis_names),
        "ici": list(plan.ici_mesh_shape),
        "dcn": list(plan.dcn_mesh_shape),
        "batch_axes": list(plan.batch_axis_names),
        "model": name,
        "model_fields": fields,
        "train": {
            "global_batch": t.global_batch,
            "remat": case[4],
            "microbatches": t.microbatches,
            "logits_chunks": t.logits_chunks,
            **(
                {"pipeline_microbatches": case[7], "pipeline_repeats": case[8]}
                if len(case) > 7
                else {}
            ),
            **({"pipeline_remat": case[9]} if len(case) > 9 else {}),
        },
        "estimate_bytes": want,
        "compiled_bytes": got,
        "referee": f"compiled by {_compilers(case[0])} (benchmarks/bench_cost.py)",
    }


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the referee rows to `path`, keeping its rows measured on real devices (those no
    compile here can redo), every row's estimate recomputed by the cost model as it is now."""
    import tomllib

    from loadax_mesh.cost.referees import referee_estimate

    kept = []
    if path.exists():
        with open(path, "rb") as f:
            kept = [
                r for r in tomllib.load(f).get("row", []) if r["referee"].startswith("measured")
            ]
    header = [
        "# The memory model against its referees, one row per step: what the compiler gave it",
        "# (libtpu's buffer assignment on TPU, memory_analysis() on GPU) or what a real device",
        "# measured, beside the estimate. Written by `python benchmarks/bench_cost.py --cache",
        "# DIR --rows configs/memory_referees.toml` (the compiled rows; measured rows are kept)",
        "# and `--refresh-rows FILE` (every estimate recomputed, no compile); the estimates are",
        "# checked to be the cost model's by tests/cost/test_band.py. The fit verdict's error",
        "# band per platform is read from these rows (loadax_mesh/cost/band.py).",
        f'date = "{time.strftime("%Y-%m-%d")}"',
        "",
    ]
    body = []
    for row in [*rows, *kept]:
        row = {**row, "estimate_bytes": referee_estimate(row)}
        body += ["[[row]]", *(f"{k} = {_toml(v)}" for k, v in row.items()), ""]
    path.write_text("\n".join(header + body))


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
            if value
            else "{}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _compilers(hardware: str) -> str:
    from importlib.metadata import version

    import jax

    compiler = "libtpu" if hardware.startswith("tpu") else "jax-cuda12-plugin"
    return f"{compiler} {version(compiler)} (jax {jax.__version__}), {time.strftime('%Y-%m-%d')}"


def show_rows(path: Path) -> None:
    """The referee rows of `path` as a markdown table (no compile): each case's estimate, with
    the model as it is now, beside what its referee gave; each platform's band (cost/band.py)."""
    import re
    import tomllib

    from loadax_mesh.cost.band import MIN_COMPILED_BYTES, memory_band
    from loadax_mesh.cost.referees import referee_estimate

    with open(path, "rb") as f:
        data = tomllib.load(f)
    print(f"{path}, written {data['date']}; estimates as the cost model gives them now\n")
    print("| hardware | mesh | model | batch | recipe | memory GB est/referee | referee |")
    print("|---|---|---|---|---|---|---|")
    for row in data["row"]:
        sizes = [i * d for i, d in zip(row["ici"], row["dcn"], strict=True)]
        mesh = " x ".join(f"{a}={n}" for a, n in zip(row["axes"], sizes, strict=True) if n > 1)
        fields = ",".join(f"{k}={v}" for k, v in row["model_fields"].items())
        t = row["train"]
        recipe = f"{t['remat']} x{t['microbatches']} /{t['logits_chunks']}"
        if "pipeline_microbatches" in t:  # 0: as many micro-batches as stages
            recipe += f" pp M{t['pipeline_microbatches'] or '=S'} R{t['pipeline_repeats']}"
            recipe += f" {t.get('pipeline_remat', 'layer')}"
        want, got = referee_estimate(row), row["compiled_bytes"]
        model = row["model"] + (f":{fields}" if fields else "")
        referee = re.sub(r" \(jax [^)]*\)| \(benchmarks/bench_cost.py\)|:.*$", "", row["referee"])
        memory = f"{want / 1e9:.2f}/{got / 1e9:.2f} ({want / got:.2f})"
        cells = [row["hardware"], mesh or "1", model, str(t["global_batch"]), recipe, memory,
                 referee]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    for platform_ in ("tpu", "gpu"):
        band = memory_band(platform_)
        if band is not None:
            print(f"\n{platform_}: rows of at least {MIN_COMPILED_BYTES / 1e9:g} GB set the band: "
                  f"{band.low:.3f} to {band.high:.3f} over {band.rows} rows")  # fmt: skip


def _ratio(want: float, got: float) -> str:
    return "-" if not got else f"{want / got:.2f}"


def _ok(want: float, got: float, tolerance: float) -> bool:
    return (not got and not want) or (bool(got) and abs(want / got - 1) <= tolerance)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="keep compile reports here as JSON")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument(
        "--recipes", action="store_true", help="only the cases that give a recipe (issue #20)"
    )
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--rows", type=Path, help="write the memory referee rows (TOML) here")
    parser.add_argument(
        "--cached", action="store_true", help="only the cases whose compile report --cache holds"
    )
    parser.add_argument(
        "--refresh-rows",
        type=Path,
        metavar="FILE",
        help="recompute every row's estimate in FILE (no compile), then stop",
    )
    parser.add_argument(
        "--show-rows",
        type=Path,
        metavar="FILE",
        help="print FILE's referee rows as a table (no compile), then stop",
    )
    args = parser.parse_args()
    if args.show_rows:
        show_rows(args.show_rows)
        return
    if args.refresh_rows:
        import tomllib

        with open(args.refresh_rows, "rb") as f:
            rows = tomllib.load(f)["row"]
        write_rows(args.refresh_rows, [r for r in rows if not r["referee"].startswith("measured")])
        return
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    lines = []
    misses = []
    referees = []
    for case in CASES:
        if args.only not in "_".join(map(str, case)) or (args.recipes and len(case) < 7):
            continue
        if args.cached and not cache_path(args.cache, case).exists():
            continue
        r = compare(case, args.cache)
        (want, got), (fit_est, fit_comp) = r["memory"], r["fits"]
        ok = _ok(want, got, TARGETS["memory"]) and fit_est == fit_comp
        host_want, host_got = r["host"]
        ok &= _ok(host_want, host_got, TARGETS["memory"])
        axes = []
        for group, b_want, b_got, a_want, a_got in r["axes"]:
            good = _ok(b_want, b_got, TARGETS["bytes"])
            text = f"{group} {b_want / 1e9:.2f}/{b_got / 1e9:.2f} GB ({_ratio(b_want, b_got)})"
            if r["gpu"] and (a_want or a_got):
                good &= _ok(a_want, a_got, TARGETS["bytes"])
                text += f", across granules {a_want / 1e9:.2f}/{a_got / 1e9:.2f}"
            axes.append(text + ("" if good else " MISS"))
            ok &= good
        if r["roofline"] is not None:
            step, roof = r["roofline"]
            good = roof is not None and roof <= step
            axes.append(
                f"roofline {roof or 0:.2f} s <= step {step:.2f} s" + ("" if good else " MISS")
            )
            ok &= good
        hardware, preset, name, batch = r["case"][:4]
        memory = f"{want / 1e9:.2f}/{got / 1e9:.2f} ({_ratio(want, got)})"
        host = "-"
        if host_want or host_got:
            host = f"{host_want / 1e9:.2f}/{host_got / 1e9:.2f} ({_ratio(host_want, host_got)})"
        if r["sum"] is not None:
            memory += f"; sum {r['sum'] / 1e9:.2f}"
        elif hardware.startswith("tpu") and r["squeezed"] is None:
            memory += " (the sum: no assignment in this report)"
        if r["squeezed"] is not None:
            memory += f"; refused, squeezed to {r['squeezed'] / 1e9:.2f}"
        cells = [
            hardware, preset, r["mesh"], name, str(batch), recipe_text(r["case"]), memory, host,
            f"{fit_est}/{fit_comp}", "; ".join(axes) or "-", "ok" if ok else "MISS",
        ]  # fmt: skip
        lines.append(cells)
        referees.append(referee_row(r["case"], r["plan"], want, got))
        if not ok:
            misses.append(cells[0:6])
        print(" | ".join(cells), f"[{r['seconds']:.0f} s]", flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{len(lines) - len(misses)} of {len(lines)} cases meet every target")
    if args.rows:
        write_rows(args.rows, referees)
    if args.markdown:
        header = ["hardware", "preset", "mesh", "model", "batch", "recipe"]
        header += ["memory GB est/compiled", "host GB est/compiled", "fits est/compiled"]
        header += ["bytes per axis est/compiled", ""]
        print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
