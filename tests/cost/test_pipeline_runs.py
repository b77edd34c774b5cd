"""The measured pipeline runs (configs/runs/pipeline.toml) and their bench
(benchmarks/bench_pipeline_runs.py): the data loads, every row names its source and
assumptions and states a recipe the cost model accepts or refuses by name, and the schedule
comparison orders torchtitan's interleaved 1F1B ahead of its 1F1B. Pure: no compile."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_pipeline_runs as bench
from loadax_mesh import MeshConfigError, simulate_devices
from loadax_mesh.published_runs import published_runs
from loadax_mesh.workload import ModelSpec

RUNS = published_runs("pipeline")["runs"]
SCHEDULE_PAIRS = bench.SCHEDULE_PAIRS

# What a row may say instead of an estimate: the cost model's refusal of what it does not price
# beside a pipeline yet, or a model the catalogue lacks. Any other MeshConfigError is a recipe
# the data states wrongly (a layer count the stages do not divide, a batch the axes do not).
REFUSED = ("is not priced by the cost model yet", "no model in the catalogue")


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_run_names_its_source_measurement_and_assumptions(run: dict) -> None:
    assert len({r["id"] for r in RUNS}) == len(RUNS)
    assert run["source"].startswith("https://github.com/")
    assert run["assumptions"] and all(isinstance(a, str) and a for a in run["assumptions"])
    measured = run["measured"]
    assert ("tps_per_gpu" in measured) != ("mfu" in measured)
    assert all(v > 0 for v in measured.values() if isinstance(v, float))
    mesh = run["mesh"]
    assert "pipeline" in mesh["axes"] and "pipeline" not in mesh["batch"]
    stages = mesh["shape"][mesh["axes"].index("pipeline")]
    assert stages > 1
    assert math.prod(mesh["shape"]) == len(simulate_devices(run["hardware"]))
    if "model" not in run:
        assert "no model in the catalogue" in run["missing"]
    else:
        ModelSpec.from_name(run["model"])


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_run_is_priced_or_refused_by_name(run: dict) -> None:
    """A priced row gives a step and a ratio to the measured one; a refused row the reason."""
    cells = bench.row(run)
    try:
        e = bench.price(run)
    except MeshConfigError as err:
        assert any(why in str(err) for why in REFUSED), str(err)
        assert cells[5].startswith("not priced: ") and str(err) in cells[5]
        return
    assert e.pipeline is not None and e.pipeline.stages > 1
    assert e.pipeline.repeats == run["train"]["pipeline_repeats"]
    assert float(cells[7]) == pytest.approx(e.step_seconds / bench.measured_step(run, e), 1e-2)
    # No collective moves negative bytes (DeepSeek-V3's input table, cut over the expert axis
    # as well as the tensor axis, was once subtracted as if cut over the tensor axis alone).
    for traffic in e.axes.values():
        assert all(c.bytes >= 0 and c.count >= 0 for c in traffic.collectives), traffic
        assert traffic.seconds >= 0 and traffic.exposed_seconds >= 0


def test_a_stand_in_keeps_each_devices_rows_and_is_priced_today() -> None:
    t5 = bench.by_id("T5")
    s = bench.stand_in(t5)
    assert s["mesh"]["axes"] == ("pipeline", "fsdp")
    assert s["mesh"]["shape"] == (8, 64)
    assert s["train"]["global_batch"] == 256 * 8
    # rows a device: 256 / fsdp 8 in the run, 2048 / fsdp 64 in the stand-in
    assert s["train"]["global_batch"] // 64 == t5["train"]["global_batch"] // 8
    e = bench.price(s)
    assert e.pipeline is not None and e.pipeline.microbatches == 8


@pytest.mark.parametrize("plain_id, inter_id, measured", SCHEDULE_PAIRS)
def test_interleaving_is_estimated_faster_as_measured(
    plain_id: str, inter_id: str, measured: float
) -> None:
    """torchtitan's interleaved 1F1B (circular, 2 repeats) against its 1F1B (GPipe), same
    stages, micro-batches and layers: measured 1.28x; the estimate orders them the same way,
    on the stand-in priced today, and as run once the cost model prices the tensor axis."""
    assert measured > 1
    plain, inter = bench.by_id(plain_id), bench.by_id(inter_id)
    assert bench.schedule_ratio(bench.stand_in(plain), bench.stand_in(inter)) > 1
    try:
        ratio = bench.schedule_ratio(plain, inter)
    except MeshConfigError as err:
        assert REFUSED[0] in str(err)
    else:
        assert ratio > 1
    # the plain schedule's bubble is the larger: the ordering comes from the schedule
    a, b = bench.price(bench.stand_in(plain)), bench.price(bench.stand_in(inter))
    assert a.pipeline is not None and b.pipeline is not None
    assert a.pipeline.bubble > b.pipeline.bubble
    assert (a.pipeline.layers, a.pipeline.microbatches) == (
        b.pipeline.layers,
        b.pipeline.microbatches,
    )
