"""choose_mesh's pipeline search (cost/choose_pipeline.py): pure, no compile."""

from __future__ import annotations

import pytest

from loadax_mesh.cost.choose import choose_mesh
from loadax_mesh.cost.choose_pipeline import PRUNED
from loadax_mesh.cost.recipes import check_recipes
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.view.estimate import ranking_text
from loadax_mesh.workload.spec import TrainSpec

AXES = ("pipeline", "data", "fsdp")
SLOW_DCN = {"dcn_bandwidth": "1 Gbps"}  # a slow network between the slices


def _exposed_dcn(choice):
    """Seconds the step waits on axes with a DCN factor."""
    return sum(a.seconds for a in choice.estimate.axes.values() if a.dcn > 1)


def test_pipeline_across_slow_dcn_wins():
    # llama2-70b on 4 x v5p-128 over a 1 Gbps DCN: data or FSDP across slices moves every
    # gradient (or weight) over the DCN each step; a pipeline across slices moves only the
    # micro-batches' activations between two stages, so it wins despite its bubble
    train = TrainSpec(global_batch=256)
    plain = choose_mesh("tpu-v5p-128-4", "llama2-70b", train, axes=AXES[1:], top=1, facts=SLOW_DCN)
    ranking = choose_mesh("tpu-v5p-128-4", "llama2-70b", train, axes=AXES, top=2, facts=SLOW_DCN)
    best, other = ranking[0], plain[0]
    p = best.estimate.pipeline
    assert p is not None and p.stages == 2 and p.bubble > 0
    assert best.dcn[0] == 2  # the stages across slices
    assert best.estimate.step_seconds < other.estimate.step_seconds
    # what it saves on the DCN is more than what the bubble costs in compute
    saved = _exposed_dcn(other) - _exposed_dcn(best)
    assert saved > best.estimate.time.compute - other.estimate.time.compute > 0
    assert f"pp2 M{p.microbatches} R{p.repeats}" in ranking_text(ranking)


def test_pipeline_loses_on_one_slice():
    # one slice: no DCN to save, the bubble only costs (the stages compute on zeros)
    train = TrainSpec(global_batch=256)
    ranking = choose_mesh("tpu-v5p-128", "llama2-70b", train, axes=AXES, top=40)
    assert ranking[0].estimate.pipeline is None
    staged = [c for c in ranking if c.estimate.pipeline is not None]
    assert staged, "some pipelined mesh is ranked"
    first = staged[0]
    assert first.estimate.step_seconds > ranking[0].estimate.step_seconds
    assert first.estimate.pipeline.bubble > 0
    rows = ranking_text(ranking).splitlines()
    assert "pp" not in next(r for r in rows if r.startswith("1."))


def test_pipeline_pins_honoured():
    train = TrainSpec(global_batch=256)
    pin = [{"pipeline_microbatches": 4, "pipeline_repeats": 1}]
    ranking = choose_mesh(
        "tpu-v5p-128-4", "llama2-70b", train, axes=AXES, top=3, facts=SLOW_DCN, recipes=pin
    )
    staged = [c.estimate.pipeline for c in ranking if c.estimate.pipeline is not None]
    assert staged
    assert all((p.microbatches, p.repeats) == (4, 1) for p in staged)


def test_pipeline_beside_tensor_and_sequence_axes_searched():
    train = TrainSpec(global_batch=64)
    axes = ("pipeline", "fsdp", "model", "seq")
    ranking = choose_mesh("tpu-v5p-32", "llama3-8b", train, axes=axes, top=100)
    assert PRUNED not in ranking.pruned
    for role in ("model", "seq"):
        assert any(
            c.estimate.pipeline is not None and c.estimate.mesh.get(role, 1) > 1 for c in ranking
        ), role


def test_pipeline_beside_moe_layers_pruned():
    train = TrainSpec(global_batch=64)
    ranking = choose_mesh("tpu-v5p-64", "mixtral-8x7b", train, axes=AXES, top=5)
    assert ranking.pruned[PRUNED] > 0
    assert all(c.estimate.pipeline is None for c in ranking)


def test_pipeline_recipe_fields_checked():
    train = TrainSpec(global_batch=64)
    assert check_recipes([{"pipeline_microbatches": 8, "pipeline_repeats": 2}], train)
    with pytest.raises(MeshConfigError, match="pipeline_repeats"):
        check_recipes([{"pipeline_repeats": 0}], train)


def test_405b_on_8_slices_considers_pipelines():
    train = TrainSpec(global_batch=8192)
    plain = choose_mesh("tpu-v5p-2048-8", "llama3-405b", train, axes=AXES[1:], top=1)
    ranking = choose_mesh("tpu-v5p-2048-8", "llama3-405b", train, axes=AXES, top=20)
    assert ranking.considered > plain.considered
    assert any(c.estimate.pipeline is not None for c in ranking)
