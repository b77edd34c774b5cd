"""Where a training step's time goes on this machine's GPU, operation by operation.

Compiles the reference step for one recipe (as benchmarks/bench_gpu_step.py does), runs it
under jax's profiler and sums the device time of the kernels on the GPU's streams by the HLO
operation each runs, over the profiled steps, grouped by what the operation is in the optimised
HLO: a matmul (a cuBLAS call or a dot fusion), the attention kernels (cuDNN), a loop's
saved-tensor update (dynamic-update-slice) or read, a copy, another fusion. Prints the groups
and the largest operations; with --out, writes them and the optimised HLO there.

    python benchmarks/probes/probe_gpu_profile.py --model llama2-7b --layers 4 --batch 4 \
        --remat full [--steps 3] [--out DIR]

Needs a GPU for device times (on a CPU the profile has no device plane: it says so).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import tempfile
from collections import defaultdict
from dataclasses import replace


def kinds(hlo: str) -> dict[str, str]:
    """Each instruction of the optimised HLO's entry and loop bodies by name -> its group."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = (?:\(.*?\)|\S+) (\w[\w-]*)\(", line)
        if not m:
            continue
        name, opcode = m.groups()
        if opcode == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            t = target.group(1) if target else ""
            matmul = "gemm" in t or "matmul" in t
            group = "attention" if "fmha" in t else "matmul" if matmul else f"call {t}"
        elif opcode == "dot" or (opcode == "fusion" and ("gemm" in line or "dot" in name)):
            group = "matmul"
        elif opcode == "fusion":
            kind = re.search(r"kind=(\w+)", line)
            group = f"fusion {kind.group(1) if kind else ''}"
            if "dynamic_update_slice" in name or "dynamic-update-slice" in name:
                group = "loop update (dynamic-update-slice)"
            elif "dynamic_slice" in name or "dynamic-slice" in name:
                group = "loop read (dynamic-slice)"
        else:
            group = opcode
        out[name] = group
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--remat", default="full")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", help="folder for the groups (JSON) and the optimised HLO")
    a = ap.parse_args()
    import jax
    from jax.profiler import ProfileData

    from loadax_mesh import MeshConfig
    from loadax_mesh.workload import ModelSpec, TrainSpec
    from loadax_mesh.workload.spec import parse_remat
    from loadax_mesh.workload.step import make_step

    model = replace(ModelSpec.from_name(a.model), num_layers=a.layers)
    train = TrainSpec(global_batch=a.batch, remat=parse_remat(a.remat))
    plan = MeshConfig.from_preset("fsdp").plan(jax.devices()[:1])
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    compiled = step.fn.lower(*step.abstract_args()).compile()
    hlo = compiled.as_text()
    params, opt = step.init(jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (a.batch, model.seq_len), 0, model.vocab_size)
    data = {"tokens": tokens, "targets": jax.numpy.roll(tokens, -1, axis=1)}
    for _ in range(2):
        params, opt, loss = compiled(params, opt, data)
    loss.block_until_ready()
    trace = tempfile.mkdtemp()
    jax.profiler.start_trace(trace)
    for _ in range(a.steps):
        params, opt, loss = compiled(params, opt, data)
    loss.block_until_ready()
    jax.profiler.stop_trace()
    path = sorted(glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True))[-1]
    profile = ProfileData.from_file(path)
    ops: dict[str, float] = defaultdict(float)
    keys: list[str] = []
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:  # kernels on the device's streams, each with its HLO op
            for e in line.events:
                stats = dict(e.stats)
                keys = keys or sorted(stats)
                ops[str(stats.get("hlo_op", e.name))] += e.duration_ns / 1e9 / a.steps
    if not ops:
        lines = {p.name: [line.name for line in p.lines] for p in profile.planes}
        print(f"no GPU plane in the profile: {lines}")
        return
    found = kinds(hlo)

    def group_of(name: str) -> str:  # an HLO name, or a kernel named after one (_N for .N)
        name = name.lstrip("%")
        return found.get(name) or found.get(re.sub(r"_(\d+)$", r".\1", name), "unknown")

    groups: dict[str, float] = defaultdict(float)
    for name, seconds in ops.items():
        groups[group_of(name)] += seconds
    total = sum(ops.values())
    print(f"{a.model} {a.layers} layers, batch {a.batch}, remat {a.remat}: {total:.4f} s of ops")
    print(f"  (a kernel's stats: {keys})")
    for g, s in sorted(groups.items(), key=lambda x: -x[1]):
        print(f"  {g:28s} {s:.4f} s ({s / total:.1%})")
    for name, s in sorted(ops.items(), key=lambda x: -x[1])[: a.top]:
        print(f"    {name:40s} {group_of(name):24s} {s * 1e3:8.2f} ms")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        tag = f"{a.model}-{a.layers}-{a.remat}".replace("=", "_").replace(",", "_")
        with open(os.path.join(a.out, f"ops-{tag}.json"), "w") as f:
            json.dump({"ops": ops, "groups": groups}, f, indent=1)
        with open(os.path.join(a.out, f"hlo-{tag}.txt"), "w") as f:
            f.write(hlo)


if __name__ == "__main__":
    main()
