"""The roofline of one calibration run's step as libtpu optimised it, whether libtpu then
compiled it or refused it for HBM, beside the step the run logged, with the operations that
bound it.

`compile_step` gives a roofline only for a program libtpu compiled (`bench_time.py --roofline`
compiles every run). A step that does not fit is refused at the buffer assignment, after XLA's
optimisations: the optimised module is in the dump (`*after_optimizations.txt`) all the same, and
its roofline is what that program would take on a device with the HBM to hold it. Compiled at
the run's compile size with libtpu's own extra remat off (the step as written, as
`compile_step` compiles a program that fits), priced per device of the compile (compile-only v4
devices are TensorCores: half a chip, `HardwareProfile.facts_for`).

    python benchmarks/probes/probe_roofline.py "MaxText-2023 22B 1x v4-128" [--squeeze] [--top N]
        [--dump DIR]

RUN is the name of a run of configs/runs/production.toml. A model-scale step compiles in seconds
to minutes here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the bench modules

from bench_time import load
from probe_fit import compile_dumped

from loadax_mesh import MeshConfig, ModelSpec, TrainSpec, topology_devices
from loadax_mesh.compiler.roofline import operation_costs, roofline
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload.step import make_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run's name in configs/runs/production.toml")
    parser.add_argument("--squeeze", action="store_true", help="let libtpu rematerialise")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--dump", type=Path)
    args = parser.parse_args()
    runs = published_runs("production")["runs"]
    names = [s["name"] for s in runs]
    if args.run not in names:
        parser.error(f"run={args.run!r} is not a calibration run; accepted: {names}")
    spec = runs[names.index(args.run)]
    hardware = spec["compile_hardware"]
    plan = MeshConfig.from_preset(spec["preset"], **spec["overrides"]).plan(
        topology_devices(hardware), selector=hardware
    )
    train = TrainSpec(**{**spec["train"], "global_batch": spec["compile_batch"]})
    mesh = plan.to_jax_mesh()
    step = make_step(
        mesh, ModelSpec.from_name(spec["model"]), train, batch_axes=plan.batch_axis_names
    )
    facts = hardware_profile(hardware).facts_for(mesh.devices.size)
    assert facts.hbm_bandwidth is not None, f"{hardware}: no HBM bandwidth in the catalogue"
    lowered = step.fn.lower(*step.abstract_args())
    with tempfile.TemporaryDirectory() as tmp:
        dump = args.dump or Path(tmp)
        verdict = compile_dumped(lowered, dump, squeeze=args.squeeze)
        text = next(dump.glob("*jit__step*after_optimizations.txt")).read_text()
    peak, bandwidth = facts.peak_flops, facts.hbm_bandwidth
    found, costs = roofline(text, peak_flops=peak, hbm_bandwidth=bandwidth), operation_costs(text)
    logged = load(spec).logged
    print(f"{args.run}: mesh {dict(mesh.shape)}, batch {train.global_batch}; {verdict}")
    print(f"device: {peak / 1e12:.1f} TFLOP/s, {bandwidth / 1e9:.0f} GB/s HBM")
    if found is None or costs is None:
        print("no roofline: an operation could not be analysed or a kernel not counted")
        return
    print(
        f"roofline {found.seconds:.3f} s (compute-bound {found.compute_seconds:.3f}, "
        f"memory-bound {found.memory_seconds:.3f}, kernels {found.kernel_seconds:.3f}); "
        f"{found.flops:.4g} FLOPs, {found.bytes:.4g} bytes; logged {logged:.3f} s, "
        f"roofline / logged {found.seconds / logged:.2f}"
    )
    print("largest operations (seconds a step: runs x max(FLOPs / peak, bytes / bandwidth)):")
    ranked = sorted(costs, key=lambda c: -c.times * c.seconds(peak, bandwidth))
    for c in ranked[: args.top]:
        seconds = c.times * c.seconds(peak, bandwidth)
        print(
            f"  {seconds:7.3f} s  x{c.times:<4d} {c.opcode:12s} {c.name[:36]:36s} "
            f"{c.flops:.3g} FLOPs {c.bytes:.3g} B  {c.shape[:60]}"
        )


if __name__ == "__main__":
    main()
