"""Compile the reference step for real TPU topologies with libtpu's compiler, on this machine.

For each case: the plan (preset rules on libtpu's compile-only devices), compile time, and what
`memory_analysis()` says per device, with fit against the HBM the compiler allows. Also
LLaMA-3 8B with fsdp 64 on v5p 4x4x4 beside MaxText's own step on the same input
(docs/facts/maxtext_reference.md: 11,459,106,976 bytes a chip).

    python benchmarks/bench_compile.py [--quick] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec

MAXTEXT_8B_FSDP64 = 11_459_106_976

# (hardware, preset, model, global batch)
CASES = [
    ("tpu-v5p-128", "fsdp", "llama3-8b", 64),  # MaxText's reference case
    ("tpu-v5p-512", "fsdp", "llama3-8b", 256),
    ("tpu-v5litepod-256", "fsdp", "llama3-8b", 256),
    ("tpu-v5litepod-256-2", "fsdp", "llama3-8b", 512),
    ("tpu-v5p-1024", "fsdp", "llama3-70b", 512),
    ("tpu-v5p-1024", "fsdp_tp", "llama3-70b", 512),
]
QUICK = [("tpu-v5litepod-8", "fsdp_tp", "tiny", 8), ("tpu-v5litepod-8-2", "fsdp", "tiny", 16)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two tiny cases only")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    header = ["hardware", "preset", "mesh", "model", "batch", "compile s", "arg GB", "temp GB"]
    header += ["total GB", "HBM GB", "fits", "TFLOP/device"]
    rows = []
    for hardware, preset, name, batch in QUICK if args.quick else CASES:
        plan = MeshConfig.from_preset(preset).plan(topology_devices(hardware))
        start = time.perf_counter()
        report = compile_step(plan, ModelSpec.from_name(name), TrainSpec(global_batch=batch))
        wall = time.perf_counter() - start
        mesh = "x".join(f"{k}{v}" for k, v in report.mesh.items() if v > 1)
        rows.append(
            [
                hardware, preset, mesh, name, str(batch), f"{wall:.0f}",
                _gb(report.argument_bytes), _gb(report.temp_bytes), _gb(report.total_bytes),
                _gb(report.hbm_bytes), str(report.fits),
                "-" if report.flops is None else f"{report.flops / 1e12:.1f}",
            ]
        )  # fmt: skip
        print(" | ".join(rows[-1]), flush=True)
        if (hardware, name) == ("tpu-v5p-128", "llama3-8b"):
            ratio = report.total_bytes / MAXTEXT_8B_FSDP64
            print(f"    MaxText's step on the same input: {_gb(MAXTEXT_8B_FSDP64)} GB; ours/theirs "
                  f"{ratio:.3f}", flush=True)  # fmt: skip
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    if args.markdown:
        print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f}"


if __name__ == "__main__":
    main()
