"""Step time against measured runs: the cost model's predicted step beside the logged one for
every run of the calibration set (configs/runs/production.toml), with its published mesh and
recipe, term by term.

The named calibrations (configs/calibration.toml) per platform are judged run by run with the
calibrations fitted on the other runs of its platform (leave one out): the prediction of a run
never saw that run. First those across granules, on how each multislice (multi-host) run's step
grows over its one-granule run's, which the compute calibrations do not change: `dcn_latency`
by least squares at each `dcn_slice_bandwidth` of a grid (TPU), the pair with the least error;
then at them `compute_efficiency` and, on TPU, `matmul_intensity`, a grid search of the squared
relative errors. `--fit` prints them fitted on all runs (what configs/calibration.toml
holds). `--roofline` also compiles each run's step (at its compile size, one TPU compile at a
time; a minute each for the v6e runs) and prints the compiled program's roofline
(`CompileReport.roofline_seconds`) beside the estimate's compute.

Logged steps: the TPU runs log their step; the A3 runs log TFLOP/s per device, converted here
with the model FLOPs this estimate counts (6 per parameter and token plus causal attention, as
MaxText counts them); MaxText's 2023 tables (part two) log TFLOP/s and MFU, converted with
the FLOPs MaxText counted then (attention whole, not halved, in the v4 and v5e tables) over
their MFU times the peak. `est/logged (shipped)` predicts with configs/calibration.toml's
calibrations (fitted on all runs). Targets (issue 33): every run within 15%; the MFU lost from
1 to N slices within 3 points of the logged loss.

    python benchmarks/bench_time.py [--fit] [--roofline] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cost.calibration import calibration, dcn_slice_bandwidth, matmul_intensity
from loadax_mesh.cost.estimate import Estimate, estimate, estimate_parts, plan_parts
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload import ModelSpec, TrainSpec


@dataclass
class Run:
    spec: dict[str, Any]
    platform: str
    parts: tuple[Any, ...]  # what estimate_parts takes
    peak: float
    logged: float  # seconds

    @property
    def measured(self) -> bool:
        """Whether the catalogue has its chip's measured shares of the peak (which then price
        its matmuls and kernels in place of `compute_efficiency`)."""
        facts = self.parts[-1]
        return any(s is not None for s in (facts.matmul_share, facts.attention_share))

    def predict(
        self,
        efficiency: float,
        intensity: float | None = None,
        latency: float = 0.0,
        granule: float | None = None,
        *,
        shares: bool = True,
    ) -> Estimate:
        """The estimate at these calibrations (intensity, granule None: no limit); `shares`
        False: as if its chip's shares were not measured (the calibrated efficiency prices it,
        as it does every GPU kind without them)."""
        parts = self.parts
        if not shares:
            bare = replace(parts[-1], matmul_share=None, attention_share=None, memory_share=None)
            parts = (*parts[:-1], bare)
        return estimate_parts(
            *parts,
            compute_efficiency=efficiency,
            intensity=intensity or float("inf"),
            dcn_latency=latency,
            slice_bandwidth=granule or float("inf"),
        )

    def latency_steps(self) -> float:
        """Seconds the step gains per second of `dcn_latency`: its ring steps across granules
        (the step is linear in it: every collective across granules is exposed)."""
        at = [self.predict(0.9, None, x).step_seconds for x in (0.0, 1e-4)]
        return (at[1] - at[0]) / 1e-4


def load(spec: dict[str, Any]) -> Run:
    model = ModelSpec.from_name(spec["model"])
    train = TrainSpec(**spec["train"])
    hardware = spec["hardware"]
    plan = MeshConfig.from_preset(spec["preset"], **spec["overrides"]).plan(
        simulate_devices(hardware), selector=hardware
    )
    e = estimate(plan, model, train)
    peak = e.model_flops / e.mfu / e.step_seconds
    logged = spec.get("step_seconds") or counted_flops(spec, e, model) / logged_flops(spec, peak)
    platform_ = "tpu" if hardware.startswith("tpu-") else "gpu"
    return Run(spec, platform_, (model, train, *plan_parts(plan)), peak, logged)


def logged_flops(spec: dict[str, Any], peak: float) -> float:
    """FLOP/s per device the run logged: its published MFU times the peak where it gives one
    (more digits than its rounded TFLOP/s), else its TFLOP/s."""
    return spec["mfu"] * peak if "mfu" in spec else spec["tflops_per_device"] * 1e12


def counted_flops(spec: dict[str, Any], e: Estimate, model: ModelSpec) -> float:
    """The model FLOPs per device the run's trainer counted: this estimate's (6 per parameter
    and token plus causal attention), plus the other half of attention where it counted the
    whole (`attention_flops` "noncausal": forward and backward, 3 x 2 x seq x heads x head_dim
    a token and layer)."""
    if spec.get("attention_flops", "causal") == "causal":
        return e.model_flops
    tokens = e.global_batch * model.seq_len / math.prod(e.mesh.values())
    per_token = 6 * model.seq_len * model.num_heads * model.head_dim * model.num_layers
    return e.model_flops + tokens * per_token


# The calibrations' grid: the share of the peak a matmul reaches, and (TPU) the FLOPs per HBM
# byte of the compiler's matmul tiles, None for no such limit.
EFFICIENCIES = tuple(round(0.30 + 0.005 * k, 3) for k in range(141))
INTENSITIES: dict[str, tuple[float | None, ...]] = {
    "tpu": (None, *(round(100 * 10 ** (k / 30)) for k in range(31))),  # 100 to 1000
    "gpu": (None,),
}
# What a granule sends across granules in all (TPU: bytes/s a slice), None for no limit.
GRANULES: dict[str, tuple[float | None, ...]] = {
    "tpu": (None, *(50e9 * k for k in range(2, 41))),  # 100 GB/s to 2 TB/s
    "gpu": (None,),
}


@dataclass
class Table:
    """A platform's runs on the grid: each run's step at every (intensity, efficiency) without
    latency or a granule's limit across granules, the seconds it gains per second of
    `dcn_latency`, its bytes across granules (as seconds at its device's own bandwidth) with
    that bandwidth and its granule's devices, its logged step, and the index of its one-slice
    (one-host) run, the same program on one granule."""

    steps: np.ndarray  # [run, intensity, efficiency]
    per_latency: np.ndarray  # [run]
    across: np.ndarray  # [run] seconds across granules at zero latency, no granule limit
    bandwidth: np.ndarray  # [run] the device's own bandwidth across granules (0: none)
    devices: np.ndarray  # [run] devices a granule
    logged: np.ndarray  # [run]
    base: list[int | None]  # None: a run on one granule

    @classmethod
    def of(cls, group: list[Run], platform: str) -> Table:
        steps = np.array(
            [
                [
                    [r.predict(k, i, shares=False).step_seconds for k in EFFICIENCIES]
                    for i in INTENSITIES[platform]
                ]
                for r in group
            ]
        )
        alone = {
            (r.spec["model"], r.spec["compile_hardware"]): n
            for n, r in enumerate(group)
            if r.spec["hardware"] == r.spec["compile_hardware"]
        }
        base = [
            None
            if r.spec["hardware"] == r.spec["compile_hardware"]
            else alone.get((r.spec["model"], r.spec["compile_hardware"]))
            for r in group
        ]
        logged = np.array([r.logged for r in group])
        priced = [r.predict(0.9) for r in group]
        facts = [r.parts[-1] for r in group]
        devices = [math.prod(ici for ici, _ in r.parts[3].values()) for r in group]
        return cls(
            steps,
            np.array([r.latency_steps() for r in group]),
            np.array([e.time.across_granules for e in priced]),
            np.array([f.dcn_bandwidth or 0.0 for f in facts]),
            np.array(devices, float),
            logged,
            base,
        )

    def across_at(self, granule: float | None) -> np.ndarray:
        """Each run's seconds across granules at zero latency with a granule's limit."""
        if granule is None:
            return self.across
        own = np.where(self.bandwidth > 0, self.bandwidth, 1.0)
        return self.across * own / np.minimum(own, granule / self.devices)

    def across_granules(
        self, platform: str, leave: int | None = None
    ) -> tuple[float, float | None]:
        """(`dcn_latency`, `dcn_slice_bandwidth`) fitted on how the steps grow from one granule
        to many (all runs but `leave`): for each granule limit of the grid the latency by least
        squares of the predicted growth against the logged one, relative to the one-granule
        step, and the pair with the least squared error. The growth is the collectives across
        granules alone (the same program on each granule): it does not depend on the compute
        calibrations."""
        best: tuple[float, float, float | None] = (math.inf, 0.0, None)
        pairs = [(n, b) for n, b in enumerate(self.base) if b is not None and leave not in (n, b)]
        if not pairs:
            return 0.0, None
        for granule in GRANULES[platform]:
            across = self.across_at(granule)
            gap = np.array([(self.logged[n] - self.logged[b] - across[n]) / self.logged[b]
                            for n, b in pairs])  # fmt: skip
            slope = np.array([self.per_latency[n] / self.logged[b] for n, b in pairs])
            latency = max(0.0, round(float(slope @ gap / (slope @ slope)), 6))
            loss = float(((gap - latency * slope) ** 2).sum())
            if loss < best[0]:
                best = (loss, latency, granule)
        return best[1], best[2]

    def errors(self, latency: float, granule: float | None) -> np.ndarray:
        """Relative error of every run at every grid point: [run, intensity, efficiency]."""
        extra = self.across_at(granule) - self.across + latency * self.per_latency
        steps = self.steps + extra[:, None, None]
        return steps / self.logged[:, None, None] - 1


def fit(
    table: Table, platform: str, leave: int | None = None
) -> tuple[float, float | None, float, float | None]:
    """The calibrations fitted on the runs in `table` but `leave`: `dcn_latency` and
    `dcn_slice_bandwidth` on the growth across granules, then (efficiency, intensity)
    minimising the squared relative errors at them (a grid search)."""
    latency, granule = table.across_granules(platform, leave)
    errors = table.errors(latency, granule)
    keep = np.ones(len(errors), bool)
    if leave is not None:
        keep[leave] = False
    loss = (errors[keep] ** 2).sum(axis=0)
    i, k = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return EFFICIENCIES[k], INTENSITIES[platform][i], latency, granule


def calibrations(fitted: tuple[float, float | None, float, float | None], run: Run) -> str:
    """A run's leave-one-out calibrations as a cell: efficiency ("chip" where its chip's
    measured shares price it instead), intensity, dcn_latency in us, dcn_slice_bandwidth in
    GB/s (none: no limit)."""
    k, i, latency, granule = fitted
    slice_ = "none" if granule is None else f"{granule / 1e9:.0f}"
    return f"{'chip' if run.measured else f'{k:.3f}'}, {i}, {latency * 1e6:.0f}, {slice_}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="print the factors fitted on all runs")
    parser.add_argument("--roofline", action="store_true", help="compile and print rooflines")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    runs = [load(spec) for spec in published_runs("production")["runs"]]
    by_platform = {p: [r for r in runs if r.platform == p] for p in ("tpu", "gpu")}
    tables = {p: Table.of(group, p) for p, group in by_platform.items()}
    if args.fit:
        for p, group in by_platform.items():
            k, i, lat, g = fit(tables[p], p)
            chip = sum(r.measured for r in group)
            aside = f"; fitted with the measured shares of {chip} runs' chips set aside"
            aside = aside if chip else ""
            print(
                f"{p}: compute_efficiency {k:.3f}, matmul_intensity {i}, dcn_latency "
                f"{lat * 1e6:.0f} us, dcn_slice_bandwidth {g} ({len(group)} runs{aside})"
            )
    shipped = {
        p: (
            calibration("compute_efficiency", p),
            matmul_intensity(p),
            calibration("dcn_latency", p),
            dcn_slice_bandwidth(p),
        )
        for p in by_platform
    }
    header = [
        "run", "part", "logged s", "predicted s", "error", "est/logged",
        "est/logged (shipped)", "MFU logged", "MFU pred",
        "efficiency, intensity, DCN us, slice GB/s (LOO)",
        "matmul", "attention", "memory-bound", "hidden comm", "exposed", "DCN", "offload",
    ]  # fmt: skip
    if args.roofline:
        header += ["roofline s", "compute / roofline"]
    rows, worst, mfu, within = [], {1: 0.0, 2: 0.0}, {}, 0
    for p, group in by_platform.items():
        for k, run in enumerate(group):
            others = fit(tables[p], p, leave=k)
            e = run.predict(*others)
            t = e.time
            err = e.step_seconds / run.logged - 1
            part = run.spec.get("part", 1)
            worst[part] = max(worst[part], abs(err))
            within += abs(err) <= 0.15
            logged_mfu = e.model_flops / run.logged / run.peak
            mfu[run.spec["name"]] = (logged_mfu, e.mfu)
            at_shipped = run.predict(*shipped[p]).step_seconds / run.logged
            cells = [
                run.spec["name"], str(part), f"{run.logged:.3f}", f"{e.step_seconds:.3f}",
                f"{err:+.1%}", f"{e.step_seconds / run.logged:.2f}", f"{at_shipped:.2f}",
                f"{logged_mfu:.3f}", f"{e.mfu:.3f}", calibrations(others, run),
                *(f"{x:.3f}" for x in (t.matmul, t.attention, t.memory_bound, t.hidden,
                                       t.exposed, t.across_granules, t.offload)),
            ]  # fmt: skip
            if args.roofline:
                roof = roofline(run)
                cells += ["-", "-"] if roof is None else [f"{roof:.3f}", f"{t.compute / roof:.2f}"]
            rows.append(cells)
    print_table(header, rows, markdown=args.markdown)
    one, sixteen = mfu["Llama2-7B A3 1 host"], mfu["Llama2-7B A3 16 hosts"]
    fall_logged, fall_pred = one[0] - sixteen[0], one[1] - sixteen[1]
    print(
        f"\n{within} of {len(rows)} runs within 15% (the target: all); worst error "
        f"{worst[1]:.1%} on part one, {worst[2]:.1%} on part two; A3 1 -> 16 hosts: MFU falls "
        f"{fall_logged * 100:.1f} points logged, {fall_pred * 100:.1f} predicted"
    )
    for first, last in slice_series(runs):
        (a_log, a_est), (b_log, b_est) = mfu[first["name"]], mfu[last["name"]]
        print(
            f"{first['name']} -> {last['name'].split()[-2]}: MFU falls "
            f"{(a_log - b_log) * 100:.1f} points logged, {(a_est - b_est) * 100:.1f} predicted "
            f"(target: within 3)"
        )
    print(f"{platform.node()}, {os.cpu_count()} cores; {time.perf_counter() - start:.1f} s")


def slice_series(runs: list[Run]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Part two's runs of one model on 1 and more slices of one kind (data parallel across
    them): each series' one-slice run and its run over the most slices."""
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        if run.spec.get("part") == 2:
            key = (run.spec["model"], run.spec["compile_hardware"])
            series.setdefault(key, []).append(run.spec)
    return [(group[0], group[-1]) for group in series.values() if len(group) > 1]


_ROOFLINES: dict[str, float | None] = {}


def roofline(run: Run) -> float | None:
    """The roofline of the run's step compiled at its compile size (one slice, or one host of a
    data-parallel run: the same program per device; compiled once for runs that share it)."""
    from loadax_mesh import compile_step, topology_devices

    spec = run.spec
    # a run over many hosts or slices compiles one of them: its train spec differs only in the
    # global batch, which compile_batch replaces
    shared = spec["hardware"] != spec["compile_hardware"]
    key = repr(
        (spec["compile_hardware"], spec["compile_batch"], spec["model"], shared or spec["train"])
    )
    if key in _ROOFLINES:
        return _ROOFLINES[key]
    hardware = spec["compile_hardware"]
    plan = MeshConfig.from_preset(spec["preset"], **spec["overrides"]).plan(
        topology_devices(hardware), selector=hardware
    )
    train = TrainSpec(**{**spec["train"], "global_batch": spec["compile_batch"]})
    report = compile_step(plan, ModelSpec.from_name(spec["model"]), train)
    _ROOFLINES[key] = report.roofline_seconds
    return report.roofline_seconds


def print_table(header: list[str], rows: list[list[str]], *, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for r in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
