"""Fit on TPU as libtpu judges it: one step compiled as written (libtpu's own extra remat off),
its assignment against the estimate, and what is live at the peak of libtpu's schedule.

libtpu refuses a program whose buffer assignment (arguments plus the preallocated temp block)
exceeds its HBM; `compile_step` reports that figure as `assigned_bytes`. Out of HBM it first
rematerialises beyond the step's own policy, so this probe turns that off
(`xla_tpu_rematerialization_min_size_in_bytes`, as `compile_step` does for a refusal) to judge
the step as written. From the dump's `*after_optimizations-live-range.txt` it prints the
largest buffers live at libtpu's peak (their sum is below the assignment by libtpu's packing of
the temp block).

    python benchmarks/probes/probe_fit.py HARDWARE PRESET MODEL BATCH REMAT [--squeeze] [--dump DIR]
        [--pipeline M,R[,REMAT]]

PRESET and MODEL as bench_cost.py writes them ("mesh:fsdp=16,model=4",
"maxtext-2023-16b:num_layers=4"); `--pipeline` a pipelined case's micro-batches, repeats
and pipeline remat as bench_cost.py's cases give them. A model-scale step compiles in seconds
to minutes here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the bench modules

from bench_cost import config, model_of, train_of

from loadax_mesh.compiler.report import _AS_WRITTEN, assigned_bytes
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload.step import make_step


def live_at_peak(dump: Path, top: int) -> None:
    """The buffers libtpu lists live at its schedule's peak, largest first, with their shapes
    (from the optimised HLO)."""
    ranges = next(dump.glob("*after_optimizations-live-range.txt")).read_text()
    hlo = next(dump.glob("*after_optimizations.txt")).read_text()
    shapes = dict(re.findall(r"^\s+(?:ROOT )?%?([\w.\-]+) = (\S+)", hlo, re.M))
    head, _, listed = ranges.partition("(peak):")
    held = re.findall(r"^\s+([\w.\-]+)(\{[\d,]*\}): (\d+) bytes", listed, re.M)
    total = sum(int(n) for _, _, n in held)
    print(f"live at libtpu's peak (position {head.split()[-1]}): {total / 2**30:.2f} GiB")
    for name, index, nbytes in sorted(held, key=lambda h: -int(h[2]))[:top]:
        print(f"  {int(nbytes) / 2**20:9.1f} MiB  {name + index:40s} {shapes.get(name, '')[:70]}")


def compile_dumped(lowered: Any, dump: Path, *, squeeze: bool) -> str:
    """Compile `lowered` with its HLO dumped to `dump` (libtpu's own extra remat off unless
    `squeeze`): "compiled", or "refused: ..." where libtpu refuses it for HBM (a refused
    program's optimised module and buffer assignment are dumped all the same)."""
    options = {"xla_dump_to": str(dump), **({} if squeeze else _AS_WRITTEN)}
    try:
        lowered.compile(compiler_options=options)
        return "compiled"
    except Exception as err:
        return "refused: " + str(err).strip().splitlines()[0][:160]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hardware")
    parser.add_argument("preset")
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("remat")
    parser.add_argument("--squeeze", action="store_true", help="let libtpu rematerialise")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", type=Path)
    parser.add_argument("--pipeline", default="", metavar="M,R[,REMAT]")
    args = parser.parse_args()
    case: tuple[Any, ...] = (args.hardware, args.preset, args.model, args.batch, args.remat)
    if args.pipeline:
        m, r, *remat = args.pipeline.split(",")
        case += (1, 1, int(m), int(r), *remat)
    plan = config(args.preset).plan(topology_devices(args.hardware))
    model, train = model_of(case), train_of(case)
    est = estimate(plan, model, train)
    print(f"{case}: estimate {est.memory_bytes / 1e9:.2f} GB (HBM {est.hbm_bytes / 1e9:.2f})")
    print("  phases GB:", {k: round(v / 1e9, 2) for k, v in est.phases.items()})
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    lowered = step.fn.lower(*step.abstract_args())
    with tempfile.TemporaryDirectory() as tmp:
        dump = args.dump or Path(tmp)
        verdict = compile_dumped(lowered, dump, squeeze=args.squeeze)
        assigned = assigned_bytes(dump)
        if assigned:
            ratio = est.memory_bytes / assigned
            print(f"assigned {assigned / 1e9:.2f} GB, estimate / assigned {ratio:.2f}; {verdict}")
        live_at_peak(dump, args.top)


if __name__ == "__main__":
    main()
