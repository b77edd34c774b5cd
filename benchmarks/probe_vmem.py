"""Where libtpu keeps the tiny model's step: HBM, which `memory_analysis()` counts, or VMEM.

The evidence behind the two tiny-model misses of bench_cost.py. The same steps are compiled for
chips with 128 MiB of VMEM per TensorCore (v5e, v6e) and with 64 MiB (v5p), the capacities in
jax's `pallas/mosaic/tpu_info.py`; then the tiny fsdp step with growing batches, on v5e (VMEM
fills up) and on v5p (the estimate falls short under remat none: see RESULTS.md). Each
row: the estimate, the compiled HBM figure (argument + output + temp - alias), their ratio,
and the VMEM the compiler's memory-space assignment uses, read from its memory-usage report
(`xla_dump_to`).

    python benchmarks/probe_vmem.py
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.cost import estimate
from loadax_mesh.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

STEPS = [("fsdp", 64, "full"), ("fsdp_tp", 64, "dots"), ("dp_sp", 32, "none"), ("fsdp", 64, "none")]
CHIPS = ["tpu-v5litepod-8", "tpu-v6e-8", "tpu-v5p-8"]
SWEEP = [
    ("tpu-v5litepod-8", "none", (32, 128, 256, 512, 1024)),
    ("tpu-v5p-8", "none", (256, 512)),
    ("tpu-v5p-8", "full", (512,)),
]


def probe(hardware: str, preset: str, batch: int, remat: str) -> str:
    """One table row: the tiny model's step estimated and compiled, its report read."""
    plan = MeshConfig.from_preset(preset).plan(topology_devices(hardware))
    model, train = ModelSpec.from_name("tiny"), TrainSpec(global_batch=batch, remat=remat)
    est = estimate(plan, model, train).memory_bytes
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=plan.batch_axis_names)
    with tempfile.TemporaryDirectory() as dump:
        options = {"xla_dump_to": dump, "xla_dump_hlo_pass_re": "NONE"}
        compiled = step.fn.lower(*step.abstract_args()).compile(compiler_options=options)
        report = next(Path(dump).glob("*memory-usage-report.txt")).read_text()
    stats = compiled.memory_analysis()
    hbm = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )
    vmem = re.search(r"Memory Space: vmem \(color=\d+\)\nTotal bytes: (\d+)", report)
    cells = [hardware, preset, str(batch), remat, f"{est / 1e6:.1f}", f"{hbm / 1e6:.1f}"]
    cells += [f"{est / hbm:.2f}", f"{int(vmem.group(1)) / 1e6:.1f}" if vmem else "-"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    print("| hardware | preset | batch | remat | estimate MB | HBM MB | est/HBM | VMEM MB |")
    print("|---|---|---|---|---|---|---|---|")
    for hardware in CHIPS:
        for preset, batch, remat in STEPS:
            print(probe(hardware, preset, batch, remat), flush=True)
    for hardware, remat, batches in SWEEP:
        for batch in batches:
            print(probe(hardware, "fsdp", batch, remat), flush=True)


if __name__ == "__main__":
    main()
