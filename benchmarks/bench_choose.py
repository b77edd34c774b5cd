"""How fast `choose_mesh` answers, up to the full 8,960-chip v5p pod (16x20x28).

No peer computes a mesh (AXLearn and MaxText hand-write theirs), so each search is set beside
the unit it is made of: planning one mesh (the winner's) on the same devices and estimating
it. Reports the search's time (median of rounds, warm: catalogue and models already read), how
many shapes and splits it considered, how many it planned, and the cold time of a fresh process
(imports included) for the largest case, in wall and CPU seconds (CPU seconds are what the
search costs when other work shares the cores). Since issue #20 each search ranks recipes
(remat, micro-batches, logits chunks) with the meshes. Target: under 2 s for 8,960 chips.

Then the searches with pipelines beside the one without, in the same run (`SIDE_BY_SIDE`):
each one's CPU seconds, the first call (what a fresh `plan --strategy auto` pays, caches
empty) and the median of the warm ones, and their ratio to the first (issue 50's targets:
at most 2x for LLaMA-3 70B on p5.48xlarge-512, 3x for Mixtral 8x7B on p5e.48xlarge-32).

    python benchmarks/bench_choose.py [--rounds N] [--side-by-side]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from loadax_mesh import choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.view.picture import shape_text
from loadax_mesh.workload import ModelSpec, TrainSpec

# (hardware, model, global batch)
CASES = [
    ("tpu-v5p-128", "llama3-8b", 64),
    ("tpu-v5litepod-256-4", "llama3-8b", 1024),
    ("gpu-p5.48xlarge-512", "llama3-70b", 512),
    ("tpu-v5p-1024", "llama3-70b", 512),
    ("tpu-v5p-17920", "llama3-70b", 8960),
    ("tpu-v5p-17920", "llama3-405b", 4480),
    ("tpu-v5p-2048-8", "llama3-405b", 8192),  # 8 slices: pipelines across them searched too
]


# (hardware, model, global batch): the reference (one slice, no pipeline searched), then two
# searches that add pipelines across granules (GPU hosts), dense and MoE
SIDE_BY_SIDE = [
    ("tpu-v5p-1024", "llama3-70b", 512),
    ("gpu-p5.48xlarge-512", "llama3-70b", 512),
    ("gpu-p5e.48xlarge-32", "mixtral-8x7b", 256),
]


def median_seconds(fn: Callable[[], object], rounds: int) -> float:
    """Median wall seconds of `rounds` calls (on a loaded machine, see `cpu_seconds`)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_seconds(fn: Callable[[], object], rounds: int) -> float:
    """Median CPU seconds of this process per call: what the search costs when other work
    shares the cores (wall time then counts the waiting too)."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def measure(hardware: str, name: str, batch: int, rounds: int) -> str:
    """One table row: search time, the unit's time, the search's counts and its winner."""
    model, train = ModelSpec.from_name(name), TrainSpec(global_batch=batch)
    devices = simulate_devices(hardware)
    ranking = choose_mesh(hardware, model, train)
    config = ranking[0].config
    search = median_seconds(lambda: choose_mesh(hardware, model, train), rounds)
    cpu = cpu_seconds(lambda: choose_mesh(hardware, model, train), rounds)
    unit = median_seconds(
        lambda: estimate(config.plan(devices, selector=hardware), model, train), rounds
    )
    e = ranking[0].estimate
    winner = f"{shape_text(e.mesh, drop_ones=True)} ({e.remat} x{e.microbatches}" + (
        f" /{e.logits_chunks})" if e.logits_chunks > 1 else ")"
    )
    return (
        f"{hardware} | {name} | {batch} | {search:.3f} | {cpu:.3f} | {unit:.3f} | "
        f"{ranking.considered} | "
        f"{ranking.planned} | {winner}"
    )


def side_by_side(rounds: int) -> None:
    """SIDE_BY_SIDE's searches in one run: CPU seconds of the first call and the median of
    `rounds` more, each against the first case's."""
    print("\nhardware | model | batch | first CPU s | warm CPU s | first / ref | warm / ref")
    ref: tuple[float, float] | None = None
    for hardware, name, batch in SIDE_BY_SIDE:
        model, train = ModelSpec.from_name(name), TrainSpec(global_batch=batch)
        first = cpu_seconds(lambda: choose_mesh(hardware, model, train), 1)  # noqa: B023
        warm = cpu_seconds(lambda: choose_mesh(hardware, model, train), rounds)  # noqa: B023
        ref = ref or (first, warm)
        print(f"{hardware} | {name} | {batch} | {first:.2f} | {warm:.2f} | "
              f"{first / ref[0]:.1f}x | {warm / ref[1]:.1f}x", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--side-by-side", action="store_true", help="only the searches with pipelines beside"
    )
    args = parser.parse_args()
    if args.side_by_side:
        side_by_side(args.rounds)
        return
    print(
        "hardware | model | batch | choose s | choose CPU s | one plan+estimate s | considered | "
        "planned | winner (recipe)"
    )
    for case in CASES:
        print(measure(*case, args.rounds), flush=True)
    code = (
        "from loadax_mesh import choose_mesh, ModelSpec, TrainSpec; "
        "choose_mesh('tpu-v5p-17920', ModelSpec.from_name('llama3-70b'), "
        "TrainSpec(global_batch=8960))"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - start
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\ncold, a fresh process (imports included), 8,960 chips: {wall:.2f} s "
          f"({child.ru_utime + child.ru_stime:.2f} s CPU; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")  # fmt: skip
    side_by_side(args.rounds)


if __name__ == "__main__":
    main()
