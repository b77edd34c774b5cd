"""Probe: does the compiled step's memory fall with micro-batches as the estimate's does?

A 2-layer model (d_model 2048, vocab 32768, seq 2048) on tpu-v5p-8 (fsdp 4), global batch 16,
full remat, compiled with 1, 2 and 4 micro-batches and with 4 micro-batches and 4 logits
chunks; printed: the estimate, the compiled total and their difference (GB), and the
estimate's live terms.

    python benchmarks/probes/probe_microbatches.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.compiler.report import compile_step
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.workload import ModelSpec, TrainSpec

MODEL = ModelSpec(
    name="mid", num_layers=2, d_model=2048, d_ff=4096, num_heads=16, num_kv_heads=4,
    head_dim=128, vocab_size=32768, seq_len=2048,
)  # fmt: skip


def main() -> None:
    plan = MeshConfig.from_preset("fsdp").plan(topology_devices("tpu-v5p-8"))
    for m, c in ((1, 1), (2, 1), (4, 1), (4, 4)):
        t = TrainSpec(global_batch=16, microbatches=m, logits_chunks=c)
        e, r = estimate(plan, MODEL, t), compile_step(plan, MODEL, t)
        live = {k: round(v / 1e9, 3) for k, v in e.memory.items() if v}
        print(
            f"M {m} C {c}: estimate {e.memory_bytes / 1e9:.3f} GB, compiled "
            f"{r.total_bytes / 1e9:.3f}, difference {(r.total_bytes - e.memory_bytes) / 1e9:+.3f}"
            f"; live {live}",
            flush=True,
        )


if __name__ == "__main__":
    main()
