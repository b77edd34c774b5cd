"""The chooser's winner for every catalogue MoE model compiles and fits as estimated, on a GPU
host and on a TPU slice (issue 42).

Each model is cut to two MoE layers (DeepSeek-V3 with one dense layer before them, Llama 4
Maverick with its dense layer before each), at its own sequence length, one sequence a device.
`choose_mesh` searches meshes, recipes and both MoE paths; its winner is compiled by the
compile-only client (XLA's CUDA client for the GPU host, libtpu for the TPU slice) and the
compiled memory (libtpu's own assignment on TPU) set beside the estimate, with both verdicts.

    python benchmarks/bench_moe_choose.py [--only SUBSTRING]

About 2 minutes a TPU case on 2 cores (libtpu at full width), under one a GPU case.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from loadax_mesh import ModelSpec

MODELS = (
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "llama4-scout-17b-16e",
    "llama4-maverick-17b-128e",
)
HARDWARE = ("gpu-p5e.48xlarge-8", "tpu-v5p-16")
BATCH = 8  # one sequence a device on either: 8 GPUs, 8 v5p chips


def cut(name: str) -> ModelSpec:
    """The model cut to two MoE layers (so that they run as a loop, as in the whole model: a
    one-trip scan XLA removes, and then frees what a loop holds), with a leading dense layer
    where it has some (DeepSeek-V3) and its dense layers between (Llama 4 Maverick)."""
    model = ModelSpec.from_name(name)
    first = min(model.first_dense_layers, 1)
    layers = first + 2 * model.moe_every
    return replace(model, name=f"{name}-{layers}l", num_layers=layers, first_dense_layers=first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    a = ap.parse_args()
    from loadax_mesh import TrainSpec, choose_mesh, compile_step, topology_devices

    header = "case | winner | recipe | est GB | compiled GB | est/compiled | fits est/compiled"
    print(header + "\n" + "|".join("---" for _ in header.split("|")))
    met = total = 0
    start = time.perf_counter()
    for hardware in HARDWARE:
        for name in MODELS:
            case = f"{hardware} {name}"
            if a.only not in case:
                continue
            model = cut(name)
            best = choose_mesh(hardware, model, TrainSpec(global_batch=BATCH))[0]
            e = best.estimate
            plan = best.config.plan(topology_devices(hardware))
            report = compile_step(plan, model, best.train)
            compiled = report.assigned_bytes or report.total_bytes
            ok = e.fits and bool(report.fits)
            met += ok
            total += 1
            mesh = " x ".join(f"{k}={v}" for k, v in e.mesh.items() if v > 1) or "1 device"
            recipe = f"{e.remat} x{e.microbatches} {e.moe}"
            print(
                f"{case} ({model.num_layers} layers) | {mesh} | {recipe} | "
                f"{e.memory_bytes / 1e9:.2f} | {compiled / 1e9:.2f} | "
                f"{e.memory_bytes / compiled:.2f} | {e.fits}/{report.fits}",
                flush=True,
            )
    print(f"\n{met} of {total} winners fit as estimated and as compiled; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
