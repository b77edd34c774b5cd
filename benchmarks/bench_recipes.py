"""The published production runs, each with its source's recipe, refereed by the compiler.

Every run of configs/runs/production.toml (docs/facts/production_runs.md) is planned on the
compile-only devices of its hardware (or of one of its DCN-joined hosts or slices, whose
per-device program is the same) and its reference step compiled with the recipe its source
gives (offloaded tensors, weight dtype, per-device batch). Printed per run: device memory
against HBM, host memory (offloaded activations) against the catalogue's host memory per
device, and whether both fit. A run that the compiler judges not to fit is a fact about this
project's step, not about the run: the runs did run.

    python benchmarks/bench_recipes.py [--cache DIR] [--only SUBSTRING] [--markdown]

`--cache DIR` keeps each compile report as JSON and reuses it. One TPU compile at a time:
libtpu holds a machine-wide lock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig
from loadax_mesh.hardware.catalogue import host_memory_per_device
from loadax_mesh.hardware.gpu_targets import device_memory
from loadax_mesh.hardware.strings import catalogue_spec
from loadax_mesh.hardware.topology import topology_devices
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload import ModelSpec, TrainSpec

RUNS = published_runs("production")["runs"]


def train_spec(run: dict[str, Any]) -> TrainSpec:
    """The run's TrainSpec at the size it is compiled at."""
    return TrainSpec(**{**run["train"], "global_batch": run["compile_batch"]})


def report(run: dict[str, Any], cache: Path | None) -> dict[str, Any]:
    """The compile report of a run as plain data (runs that compile the same program share
    one compile, and the cache keeps it)."""
    from loadax_mesh.compiler.report import compile_step

    train = train_spec(run)
    parts = (run["compile_hardware"], run["preset"], run["model"], run["compile_batch"])
    parts += (train.remat_text, train.param_dtype, train.opt_state_dtype)
    parts += (train.microbatches, train.logits_chunks)
    key = "_".join(map(str, parts)).replace("=", "-").replace(",", "+")
    path = None if cache is None else cache / f"{key}.json"
    if path is not None and path.exists():
        return json.loads(path.read_text())
    config = MeshConfig.from_preset(run["preset"], **run["overrides"])
    plan = config.plan(topology_devices(run["compile_hardware"]))
    data = compile_step(plan, ModelSpec.from_name(run["model"]), train).to_dict()
    if path is not None:
        path.write_text(json.dumps(data))
    return data


def _gb(value: int | None) -> str:
    return "?" if value is None else f"{value / 1e9:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="keep compile reports here as JSON")
    parser.add_argument("--only", default="", help="run the runs whose name contains this")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in RUNS:
        if args.only not in run["name"]:
            continue
        start = time.perf_counter()
        r = report(run, args.cache)
        train = train_spec(run)
        pdbs = run["compile_batch"] // _devices(r["mesh"])
        seq = ModelSpec.from_name(run["model"]).seq_len
        device = f"{_gb(r['total_bytes'])} / {_gb(r['hbm_bytes'])}"
        fits = str(r["fits"])
        own = _own_pool(run)
        if own is not None:  # judged also against the pool the run's script set
            device += f" ({_gb(own)} at its {run['gpu_mem_fraction']})"
            fits += f" ({r['total_bytes'] <= own} at its pool)"
        if r.get("squeezed_bytes") is not None:
            device += f" (refused; squeezed to {_gb(r['squeezed_bytes'])})"
        # The host memory of the run's own machine type: the report names hardware by what
        # the planner detects from the devices (A3's H100s read as p5.48xlarge).
        spec = catalogue_spec(run["compile_hardware"])
        have = None if spec is None else host_memory_per_device(spec.type)
        host = f"{_gb(r.get('host_bytes'))} / {_gb(None if have is None else int(have))}"
        cells = [
            run["name"],
            run["compile_hardware"],
            "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1),
            f"{pdbs} x {seq}",
            train.remat_text,
            train.param_dtype,
            device,
            host,
            fits,
            f"{r['compile_seconds']:.0f}",
        ]
        rows.append(cells)
        print(" | ".join(cells), f"[{time.perf_counter() - start:.0f} s]", flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    if args.markdown:
        header = ["run", "compiled for", "mesh", "pdbs x seq", "remat", "weights"]
        header += ["device GB / HBM", "host GB / host memory", "fits", "compile s"]
        print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")


def _own_pool(run: dict[str, Any]) -> int | None:
    """The GPU memory jax's client could take in the run itself (its script's fraction of the
    GPU's memory), None where the run sets none."""
    fraction = run.get("gpu_mem_fraction")
    spec = catalogue_spec(run["compile_hardware"])
    if fraction is None or spec is None:
        return None
    total = device_memory(spec.type.device_kind)
    return None if total is None else int(fraction * total)


def _devices(mesh: dict[str, int]) -> int:
    total = 1
    for size in mesh.values():
        total *= size
    return total


if __name__ == "__main__":
    main()
