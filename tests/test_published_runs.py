"""The published runs as data (configs/runs/*.toml through loadax_mesh/published_runs.py): each
set loads with its groups expanded, every run names its source, the named texts are written
out, and a set that does not exist is refused by name."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfigError
from loadax_mesh.published_runs import SETS, published_runs
from loadax_mesh.workload import ModelSpec, TrainSpec


@pytest.mark.parametrize("name", SETS)
def test_every_run_names_its_source_hardware_and_a_recipe(name: str) -> None:
    data = published_runs(name)
    runs = data["runs"]
    assert runs and len({r["name"] for r in runs}) == len(runs)
    texts = set(data.get("text", {}))
    for run in runs:
        assert run["source"].startswith("https://github.com/"), run["name"]
        assert run["hardware"].startswith(("tpu-", "gpu-")), run["name"]
        assert "global_batch" in run["train"] or "model" not in run, run["name"]
        assert not texts & {run["source"], run.get("notes"), *run.get("assumptions", ())}
        if "model" in run:  # a catalogue model, and a recipe TrainSpec accepts
            ModelSpec.from_name(run["model"])
            TrainSpec(**run["train"])


def test_a_group_shares_its_fields_and_a_run_overrides_them_key_by_key() -> None:
    production = published_runs("production")["runs"]
    assert len(production) == 59  # 15 of part one, 44 of part two (docs/facts/production_runs.md)
    assert sum(r.get("part") == 2 for r in production) == 44
    a3 = [r for r in production if r["name"].startswith("Llama2-7B A3")]
    assert {r["gpu_mem_fraction"] for r in a3} == {0.85}  # the group's
    assert [r["train"]["global_batch"] for r in a3] == [32, 64, 128, 256, 512]  # each run's
    assert all("step_seconds" not in r for r in a3)  # the source logs TFLOP/s, not a step
    moe = published_runs("moe")["runs"]
    m1 = next(r for r in moe if r["name"].startswith("M1 "))
    assert m1["train"] == {"global_batch": 2048, "remat": "full", "moe": "capacity",
                           "capacity_factor": 1.25, "routing": "balanced"}  # fmt: skip


def test_each_call_is_a_fresh_copy() -> None:
    published_runs("moe")["runs"][0]["train"]["global_batch"] = 1
    assert published_runs("moe")["runs"][0]["train"]["global_batch"] == 2048


def test_a_set_that_does_not_exist_is_refused_by_name() -> None:
    with pytest.raises(MeshConfigError, match=r"name='dense'.*accepted: \('production'"):
        published_runs("dense")
