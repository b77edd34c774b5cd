"""The calibration runs (configs/runs/production.toml) through the cost model: each run's
published mesh and recipe estimated (does it fit, device and host bytes, step time), and
`choose_mesh`'s best mesh and recipe for the same hardware, model and global batch (its
estimated step against the published recipe's estimate, and against the logged step).

Targets: no published recipe (each trained) judged "does not fit": each "fits" or "within the
model's error" (the verdict with the model's measured memory error, cost/band.py); the choice
at least as fast as the published recipe by our estimate. The choice leaves 10% of memory free
by default (`headroom`), while a published recipe is judged by the estimate alone (against
100% of memory, with the model's error band); the choice is also
made with `headroom=0.0`, judged as the published recipe is. A report of the estimate's time
against the logged one, not a target (issue #21 builds the fuller time model).

    python benchmarks/bench_runs.py [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.published_runs import published_runs
from loadax_mesh.view.picture import shape_text
from loadax_mesh.workload import ModelSpec, TrainSpec

RUNS = published_runs("production")["runs"]

_RECIPE = ("remat", "microbatches", "logits_chunks")


def short(remat: str) -> str:
    """A remat text short enough for a table: the offloaded tensors named once."""
    if "=" not in remat:
        return remat
    pairs = dict(p.split("=") for p in remat.split(","))
    where: dict[str, list[str]] = {}
    for t, p in pairs.items():
        where.setdefault(p, []).append(t)
    return "; ".join(f"{p}: {','.join(ts)}" for p, ts in where.items())


def row(run: dict) -> tuple[list[str], str, bool, bool]:
    # A GPU run's script sets the share of memory jax's client takes; the estimate reads the
    # variable jax reads (XLA_PYTHON_CLIENT_MEM_FRACTION), as it would on the run's machine.
    os.environ.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    if run.get("gpu_mem_fraction") is not None:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(run["gpu_mem_fraction"])
    model = ModelSpec.from_name(run["model"])
    hardware = run["hardware"]
    config = MeshConfig.from_preset(run["preset"], **run["overrides"])
    plan = config.plan(simulate_devices(hardware), selector=hardware)
    published = TrainSpec(**run["train"])
    theirs = estimate(plan, model, published)
    # the same hardware, model, batch and dtypes; the mesh and recipe searched
    base = TrainSpec(**{k: v for k, v in run["train"].items() if k not in _RECIPE})
    best = choose_mesh(hardware, model, base, top=1)[0]
    ours = best.estimate
    bare = choose_mesh(hardware, model, base, top=1, headroom=0.0)[0].estimate
    faster = ours.step_seconds <= theirs.step_seconds * (1 + 1e-9)
    bare_faster = bare.step_seconds <= theirs.step_seconds * (1 + 1e-9)
    logged = "-" if run.get("step_seconds") is None else f"{run['step_seconds']:.3f}"
    cells = [
        run["name"],
        str(published.global_batch),
        f"{shape_text(theirs.mesh, drop_ones=True)}; {short(theirs.remat)}",
        f"{theirs.memory_bytes / 1e9:.1f}/{theirs.hbm_bytes / 1e9:.1f}",
        f"{theirs.host_bytes / 1e9:.1f}",
        theirs.verdict,
        f"{theirs.step_seconds:.3f}",
        logged,
        f"{shape_text(ours.mesh, drop_ones=True)}; {short(ours.remat)} x{ours.microbatches}"
        + (f" /{ours.logits_chunks}" if ours.logits_chunks > 1 else ""),
        f"{ours.memory_bytes / 1e9:.1f} (+{ours.host_bytes / 1e9:.1f} host)",
        f"{ours.step_seconds:.3f}",
        f"{ours.step_seconds / theirs.step_seconds:.2f}",
        f"{shape_text(bare.mesh, drop_ones=True)}; {short(bare.remat)} x{bare.microbatches}"
        + (f" /{bare.logits_chunks}" if bare.logits_chunks > 1 else ""),
        f"{bare.step_seconds / theirs.step_seconds:.2f}",
    ]
    return cells, theirs.verdict, faster, bare_faster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    header = [
        "run", "batch", "published mesh; remat", "device GB est/HBM", "host GB", "verdict",
        "est step s", "logged step s", "chosen mesh; remat x micro [/chunks]",
        "device GB", "est step s", "chosen/published", "chosen at headroom 0",
        "its step/published",
    ]  # fmt: skip
    rows, fast, bare = [], 0, 0
    verdicts: dict[str, int] = {}
    for run in RUNS:
        cells, verdict, faster, bare_faster = row(run)
        rows.append(cells)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        fast += faster
        bare += bare_faster
        if not args.markdown:
            print(" | ".join(cells), flush=True)
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(
        f"published recipes of {len(RUNS)}: "
        + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        + "; the choice at least as fast "
        f"as the published recipe in {fast} of {len(RUNS)} ({bare} at headroom 0); "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
