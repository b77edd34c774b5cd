"""MaxText's own compiler referees the MaxText export.

For each case: plan on libtpu's compile-only devices, compile the reference step
(`compile_step`), export the plan and recipe with `MeshPlan.to_maxtext`, and run MaxText's
`train_compile` with exactly those keys (plus `compile_topology`). Printed per case: our memory
per device and MaxText's (argument + output + temp - alias from `memory_analysis()`, and the
host bytes of an offload recipe), their ratio and whether both fit. Target: MaxText compiles
every export, fits where `compile_step` says it fits, and its memory is within 25% of ours
and of the estimate (`estimate(...).memory_bytes`, against MaxText's libtpu assignment where
dumped). Beside the sums, each side's libtpu buffer assignment (arguments and the temp block,
what libtpu's own HBM check counts: `CompileReport.assigned_bytes`, and for MaxText the
memory-usage report of its train step, dumped with `--xla_dump_to`).

MaxText is not part of this project: install it outside the repository in a venv of its own
(docs/facts/maxtext_reference.md) and give its source and python:

    python benchmarks/bench_maxtext.py --maxtext /work/maxtext_env/maxtext \\
        --python /work/maxtext_env/venv/bin/python [--only SUBSTRING] [--markdown]

libtpu holds a machine-wide lock, so every compile runs in a child process of its own, one at a
time; a child that finds the lock taken is retried.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadax_mesh.compiler.report import assigned_bytes

# (hardware, preset, model, global batch, recipe as TrainSpec keywords, pipeline fields too)
# "auto": choose_mesh's winner with the recipe it chose (the recipe given is then empty); a
# name in MESHES: that mesh (shape, axis names, batch axes) rather than a preset; the
# model a catalogue name, with integer field overrides after a colon (fewer layers compile
# here in minutes; the export resizes MaxText's own config of the model to match)
MIXTRAL_4L = "mixtral-8x7b:num_layers=4,seq_len=8192"  # full width, 4 of 32 layers
LLAMA_32K = "llama3-8b:num_layers=4,seq_len=32768"
CASES: list[tuple[str, str, str, int, dict[str, Any]]] = [
    ("tpu-v5p-512", "fsdp", "llama3-8b", 256, {}),  # docs/exports.md's MaxText export
    ("tpu-v5p-1024", "auto", "llama3-70b", 512, {}),  # docs/exports.md, --strategy auto
    ("tpu-v5p-64-2", "fsdp", "llama3-8b", 64, {}),  # multislice: data over DCN x fsdp 32
    ("tpu-v5p-128", "fsdp_tp", "llama3-8b", 64, {}),  # tensor parallel 4
    ("tpu-v5p-128", "fsdp", "llama3-8b", 64, {"remat": "offload"}),  # layer inputs on host
    ("tpu-v5p-128", "fsdp", "llama3-8b", 128, {"microbatches": 2, "logits_chunks": 4}),
    ("tpu-v5p-128", "fsdp_ep", MIXTRAL_4L, 64, {}),  # fsdp 16 x expert 4, dropless
    ("tpu-v5p-16", "fsdp", MIXTRAL_4L, 8, {}),  # experts on fsdp 8 (shard_exp_on_fsdp)
    # GPipe (4 stages x fsdp 16) and circular, with MaxText's remat (one checkpoint an
    # iteration), and GPipe with the step's default (a checkpoint a layer, which no MaxText key
    # gives: its row misses by design, the export's note says by how much)
    ("tpu-v5p-128", "pipeline4_fsdp", "llama3-8b", 64, {"pipeline_remat": "iteration"}),
    (
        "tpu-v5p-128",
        "pipeline4_fsdp",
        "llama3-8b",
        64,
        {"pipeline_repeats": 2, "pipeline_remat": "iteration"},
    ),
    ("tpu-v5p-128", "pipeline4_fsdp", "llama3-8b", 64, {}),
    # context parallelism: fsdp 2 x seq 4 at 32k tokens, keys gathered whole or passed round
    ("tpu-v5p-16", "fsdp_seq4", LLAMA_32K, 2, {"context_strategy": "all_gather"}),
    ("tpu-v5p-16", "fsdp_seq4", LLAMA_32K, 2, {"context_strategy": "ring"}),
]
# Meshes no preset names: (mesh_shape, mesh_axis_names, batch_axis_names) of a MeshConfig.
MESHES: dict[str, tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]] = {
    "pipeline4_fsdp": ((4, -1), ("pipeline", "fsdp"), ("fsdp",)),
    "fsdp_seq4": ((-1, 4), ("fsdp", "seq"), ("fsdp",)),
}
TARGET = 0.25
LOCKED = ("TPU in use", "lockfile", "libtpu_lockfile", "Resource busy")

OURS = """
import dataclasses, json, os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from loadax_mesh import MeshConfig, choose_mesh, topology_devices, compile_step, estimate
from loadax_mesh.workload import ModelSpec, TrainSpec
hw, preset, model, batch, recipe = json.loads(sys.argv[1])
mesh = json.loads(sys.argv[2])
name, _, overrides = model.partition(":")
fields = {k: int(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
spec = dataclasses.replace(ModelSpec.from_name(name), **fields)
train = TrainSpec(global_batch=batch, **recipe)
if preset == "auto":
    best = choose_mesh(hw, spec, train)[0]
    plan = best.config.plan(topology_devices(hw), selector=hw)
    train = best.train
else:
    mesh_config = MeshConfig(*mesh) if mesh else MeshConfig.from_preset(preset)
    plan = mesh_config.plan(topology_devices(hw), selector=hw)
config = plan.to_maxtext(train, model=spec)
report = compile_step(plan, spec, train)
est = estimate(plan, spec, train)
piped = f" pp R{train.pipeline_repeats} {train.pipeline_remat}" if est.pipeline else ""
print("RESULT " + json.dumps({
    "estimate": est.memory_bytes,
    "args": config.args(), "notes": list(config.notes), "order": config.order.lines("MaxText"),
    "total": report.total_bytes, "host": report.host_bytes, "fits": report.fits,
    "assigned": report.assigned_bytes,
    "hbm": report.hbm_bytes, "seconds": report.compile_seconds,
    "mesh": "x".join(f"{k}{v}" for k, v in report.mesh.items() if v > 1),
    "recipe": f"{train.remat_text} x{train.microbatches} /{train.logits_chunks}{piped}",
}))
"""


def _run(cmd: list[str], cwd: str | None, env: dict[str, str], tries: int = 20) -> str:
    """Run a compile child; wait and retry while another process holds libtpu's lock."""
    for _ in range(tries):
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        out = done.stdout + done.stderr
        if done.returncode == 0:
            return out
        if not any(s in out for s in LOCKED):
            raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{out[-4000:]}")
        time.sleep(30)
    raise RuntimeError("libtpu stayed locked by another process")


def topology(hardware: str) -> tuple[str, int]:
    """MaxText's compile_topology and slice count for a catalogue TPU string."""
    m = re.fullmatch(r"tpu-(v5litepod|v5p|v6e|v4)-(\d+)(?:-(\d+))?", hardware)
    if m is None:
        raise SystemExit(f"{hardware}: no MaxText compile_topology for it")
    kind = {"v5litepod": "v5e"}.get(m[1], m[1])
    return f"{kind}-{m[2]}", int(m[3] or 1)


def maxtext_memory(out: str) -> dict[str, int]:
    """The CompiledMemoryStats line train_compile prints, as numbers."""
    line = re.search(r"Memory analysis: CompiledMemoryStats\((.*)\)", out)
    if line is None:
        raise RuntimeError(f"no memory analysis in MaxText's output:\n{out[-3000:]}")
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line[1])}


def run_case(
    case: tuple[Any, ...], maxtext: Path, python: str, keep: str | None = None
) -> dict[str, Any]:
    hw = case[0]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    mesh = json.dumps(MESHES.get(case[1]))
    ours_out = _run([sys.executable, "-c", OURS, json.dumps(case), mesh], None, env)
    ours = json.loads(ours_out.split("RESULT ", 1)[1].splitlines()[0])
    name, slices = topology(hw)
    cmd = [
        python,
        "-m",
        "maxtext.trainers.pre_train.train_compile",
        "src/maxtext/configs/base.yml",
        *ours["args"],
        f"compile_topology={name}",
        f"compile_topology_num_slices={slices}",
        "jax_cache_dir=",
        "run_name=bench_maxtext",
        "dump_hlo=false",
    ]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=keep) as dump:
        flags = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        out = _run(cmd, str(maxtext), {**env, "XLA_FLAGS": flags})
        assigned = assigned_bytes(Path(dump), "train_step")
        if keep is not None:  # its buffer-by-buffer reports, to read beside ours
            os.rename(dump, Path(keep) / f"maxtext-{name}-{case[1]}-{int(start)}")
            os.mkdir(dump)
    stats = maxtext_memory(out)
    theirs = (
        stats["argument_size_in_bytes"]
        + stats["output_size_in_bytes"]
        + stats["temp_size_in_bytes"]
        - stats["alias_size_in_bytes"]
    )
    return {
        "case": case,
        "ours": ours,
        "maxtext_total": theirs,
        "maxtext_stats": stats,
        "maxtext_host": stats.get("host_temp_size_in_bytes", 0),
        "maxtext_assigned": assigned,
        # judged as compile_step judges ours on TPU: by libtpu's own assignment where dumped
        "maxtext_fits": (assigned or theirs) <= ours["hbm"],
        "maxtext_seconds": time.perf_counter() - start,
    }


def row(r: dict[str, Any]) -> list[str]:
    hw, preset, model, batch, _ = r["case"]
    o = r["ours"]
    ratio = r["maxtext_total"] / o["total"]
    judged = r.get("maxtext_assigned") or r["maxtext_total"]  # as libtpu's HBM check counts
    by_estimate = judged / o["estimate"]
    recipe_text = o["recipe"]
    host = f"{(o['host'] or 0) / 1e9:.2f} / {r['maxtext_host'] / 1e9:.2f}"
    ok = abs(ratio - 1) <= TARGET and abs(by_estimate - 1) <= TARGET
    ok &= o["fits"] == r["maxtext_fits"]
    return [
        f"{hw} {preset} ({o['mesh']})",
        f"{model} x{batch}",
        recipe_text,
        f"{o['total'] / 1e9:.2f}",
        f"{r['maxtext_total'] / 1e9:.2f}",
        f"{ratio:.2f}",
        host,
        f"{o['fits']}/{r['maxtext_fits']}",
        _gb_pair(o.get("assigned"), r.get("maxtext_assigned")),
        f"{o['estimate'] / 1e9:.2f} ({by_estimate:.2f})",
        "ok" if ok else "MISS",
    ]


HEAD = ["plan", "model x batch", "recipe", "ours GB", "MaxText GB", "ratio", "host GB o/M",
        "fits o/M", "assigned GB o/M", "estimate GB (MaxText's / it)", ""]  # fmt: skip


def _gb_pair(ours: int | None, theirs: int | None) -> str:
    """Both sides' libtpu assignments and their ratio (MaxText's over ours); "-" for a side
    without one (ours is missing where compile_step's program does not fit)."""
    if not ours or not theirs:
        return " / ".join("-" if not b else f"{b / 1e9:.2f}" for b in (ours, theirs))
    return f"{ours / 1e9:.2f} / {theirs / 1e9:.2f} ({theirs / ours:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxtext", required=True, help="MaxText's source (holds src/maxtext)")
    parser.add_argument("--python", required=True, help="the python of MaxText's venv")
    parser.add_argument("--only", default="")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--keep", help="a folder to keep MaxText's XLA dumps in")
    args = parser.parse_args()
    maxtext = Path(args.maxtext)
    if not (maxtext / "src/maxtext/configs/base.yml").exists():
        raise SystemExit(f"--maxtext {maxtext}: no src/maxtext/configs/base.yml there")
    rows = [HEAD]
    for case in CASES:
        if args.only not in f"{case[0]} {case[1]} {case[2]} {case[4]}":
            continue
        r = run_case(case, maxtext, args.python, args.keep)
        rows.append(row(r))
        print(" | ".join(rows[-1]), flush=True)
        stats = " ".join(f"{k}={v}" for k, v in r["maxtext_stats"].items() if v)
        for line in [
            *r["ours"]["order"],
            f"MaxText's memory_analysis: {stats}",
            " ".join(r["ours"]["args"]),
        ]:
            print(f"    {line}", flush=True)
    if args.markdown:
        print(
            "\n".join(
                "| " + " | ".join(x) + " |" for x in [rows[0], ["---"] * len(HEAD), *rows[1:]]
            )
        )


if __name__ == "__main__":
    main()
