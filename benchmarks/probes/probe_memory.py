"""The memory model outside bench_cost.py's cases: two probes against libtpu's compiler.

1. Where libtpu keeps the tiny model's step: HBM, which `memory_analysis()` counts, or VMEM
   (the evidence behind bench_cost's two tiny-model misses). The same steps are compiled for
   chips with 128 MiB of VMEM per TensorCore (v5e, v6e) and with 64 MiB (v5p), the capacities
   in jax's `pallas/mosaic/tpu_info.py`; then the tiny fsdp step with growing batches, on v5e
   (VMEM fills up) and on v5p (the estimate falls short under remat none). Each row: the
   estimate, the compiled HBM figure (argument + output + temp - alias), their ratio, and the
   VMEM the compiler's memory-space assignment uses, read from its memory-usage report
   (`xla_dump_to`).
2. Small models whose steps are mostly activations (4 layers, d_model 16 x head_dim, 8
   sequences of 2,048 tokens a device on v5p-8) under each remat policy, head_dim 64 and 128.

    python benchmarks/probes/probe_memory.py       (about 20 minutes on 2 cores)
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step, held_bytes
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
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
    hbm = held_bytes(compiled.memory_analysis())
    vmem = re.search(r"Memory Space: vmem \(color=\d+\)\nTotal bytes: (\d+)", report)
    cells = [hardware, preset, str(batch), remat, f"{est / 1e6:.1f}", f"{hbm / 1e6:.1f}"]
    cells += [f"{est / hbm:.2f}", f"{int(vmem.group(1)) / 1e6:.1f}" if vmem else "-"]
    return "| " + " | ".join(cells) + " |"


def small(head_dim: int, remat: str) -> str:
    """One row of probe 2: a small model's fsdp step on v5p-8, estimated and compiled."""
    model = ModelSpec(
        name=f"small-hd{head_dim}", num_layers=4, d_model=16 * head_dim, d_ff=2816,
        num_heads=16, num_kv_heads=4, head_dim=head_dim, vocab_size=32000, seq_len=2048,
    )  # fmt: skip
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices("tpu-v5p-8"))
    train = TrainSpec(global_batch=32, remat=remat)
    est = estimate(plan, model, train).memory_bytes
    got = compile_step(plan, model, train).total_bytes
    cells = [str(head_dim), remat, f"{est / 1e9:.2f}", f"{got / 1e9:.2f}", f"{est / got:.2f}"]
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
    print("\n| head_dim | remat | estimate GB | compiled GB | est/compiled |")
    print("|---|---|---|---|---|")
    for head_dim in (64, 128):
        for remat in ("none", "dots", "full"):
            print(small(head_dim, remat), flush=True)


if __name__ == "__main__":
    main()
