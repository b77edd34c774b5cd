"""What libtpu overlaps: the scheduled HLO of small steps, read per layer-loop body.

1. A tensor-16 step (fsdp 2 x tensor 16 on tpu-v5litepod-32, 2 layers of a two-matrix model,
   d_model 4096), under full and dots remat: per loop body the tensor-parallel activation
   collectives that run in line (an all-gather or an all-reduce-scatter fusion the next op
   waits for), the async ones (an async collective start, or fusion, with matmuls scheduled
   before its end), and the windowed matmuls (a collective matmul: a loop of permutes beside
   the matmul's pieces).
   `--parallel`: the same step with the layer a parallel block (ModelSpec.parallel_block:
   attention and the MLP off one norm, their outputs summed), against which the cost model's
   counts of that layer were read (cost/parts/traffic.py, `_parallel_block_runs`).
2. A two-slice step (fsdp on tpu-v5litepod-8-2, data across the slices): the megascale
   transfers (a send per array) per loop body, their dtype and bytes.

Each compile takes about two minutes on 2 cores; one TPU compile at a time.

    python benchmarks/probes/probe_overlap.py [--only tensor|slices] [--parallel]
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter
from dataclasses import replace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig, topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

WIDE = ModelSpec(
    name="probe-tensor",
    num_layers=2,
    d_model=4096,
    d_ff=16384,
    num_heads=16,
    num_kv_heads=16,
    head_dim=256,
    vocab_size=32768,
    seq_len=2048,
    mlp="relu",
    tied_embeddings=True,
)
SMALL = ModelSpec(
    name="probe-slices",
    num_layers=4,
    d_model=1024,
    d_ff=4096,
    num_heads=8,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=8192,
    seq_len=512,
)
_HEAD = re.compile(r"^(?:ENTRY )?%(\S+) ")
_COLLECTIVE = re.compile(r" (all-gather|reduce-scatter|all-reduce)\(")


def compiled(hardware: str, preset: str, model: ModelSpec, train: TrainSpec, **kw: int) -> str:
    plan = MeshConfig.from_preset(preset, **kw).plan(topology_devices(hardware))
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    return str(step.fn.lower(*step.abstract_args()).compile().as_text())


def computations(hlo: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        head = _HEAD.match(line)
        if head and line.rstrip().endswith("{"):
            name = head[1]
            found[name] = []
        elif name and line.startswith("  "):
            found[name].append(line)
    return found


def tensor_collectives(hlo: str, seq: int) -> dict[str, Counter[str]]:
    """Per loop body holding layers: the activation collectives ([rows, seq, ...] buffers) by
    how they run."""
    comps = computations(hlo)
    act = re.compile(rf"\[\d+,{seq},")
    found: dict[str, Counter[str]] = {}
    for name, lines in comps.items():
        loops = [re.search(r"body=%([\w.\-]+)", x) for x in lines if " while(" in x]
        if not loops:
            continue
        seen: Counter[str] = Counter()
        for line in lines:
            kind = _COLLECTIVE.search(line)
            if kind and act.search(line.split("(")[0]):
                seen[f"in line: {kind[1]}"] += 1
            if "-done" in line:  # the end of an async pair, counted at its start
                continue
            for callee in re.findall(r"calls=%([\w.\-]+)", line):
                for inner in comps.get(callee, []):
                    k = _COLLECTIVE.search(inner)
                    if not k or not act.search(inner.split("(")[0]):
                        continue
                    started = "-start" in line or "async_collective" in callee
                    seen[f"{'async' if started else 'in line'}: {k[1]}"] += 1
        for loop in loops:
            if loop and "windowed_dot_general" in loop[1]:
                seen["windowed matmul: " + ("gather" if "_ag" in loop[1] else "reduce")] += 1
        found[name] = seen
    return found


def megascale_sends(hlo: str) -> dict[str, Counter[str]]:
    comps = computations(hlo)
    found: dict[str, Counter[str]] = {}
    for name, lines in comps.items():
        sent = [x for x in lines if "xla_megascale" in x and " send(" in x]
        sends = Counter(m[1] for x in sent if (m := re.search(r"= \((\w+\[[\d,]*\])", x)))
        if sends:
            found[name] = sends
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("tensor", "slices"))
    parser.add_argument("--parallel", action="store_true", help="the layer a parallel block")
    args = parser.parse_args()
    if args.only != "slices":
        wide = replace(WIDE, parallel_block=args.parallel)
        for remat in ("full", "dots"):
            train = TrainSpec(global_batch=2, remat=remat)
            hlo = compiled("tpu-v5litepod-32", "fsdp_tp", wide, train, tp=16)
            print(f"tensor 16, remat {remat}{', parallel block' if args.parallel else ''}:")
            for body, seen in tensor_collectives(hlo, WIDE.seq_len).items():
                print(f"  {body[:40]}: {dict(sorted(seen.items()))}")
    if args.only != "tensor":
        hlo = compiled("tpu-v5litepod-8-2", "fsdp", SMALL, TrainSpec(global_batch=32, remat="full"))
        print("two slices, data across them (megascale sends by buffer):")
        for where, sends in megascale_sends(hlo).items():
            print(f"  {where[:40]}: {sum(sends.values())} sends {dict(sends)}")


if __name__ == "__main__":
    main()
