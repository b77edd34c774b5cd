"""choose_mesh's pipeline search (cost/choose/pipeline.py): pure, no compile."""

from __future__ import annotations

import re

import pytest

from loadax_mesh.cost.choose.mesh import AXES as AXES_DEFAULT
from loadax_mesh.cost.choose.mesh import choose_mesh
from loadax_mesh.cost.choose.recipes import check_recipes
from loadax_mesh.cost.choose.search import for_mesh
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.view.estimate import ranking_text
from loadax_mesh.workload.layout import check_fit, roles
from loadax_mesh.workload.spec import ModelSpec, TrainSpec
from loadax_mesh.workload.stages import dividing_layers

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


@pytest.mark.parametrize("batch", [8, 64])
def test_pipeline_beside_tensor_and_sequence_axes_searched(batch):
    train = TrainSpec(global_batch=batch)
    axes = ("pipeline", "fsdp", "model", "seq")
    ranking = choose_mesh("tpu-v5p-32", "llama3-8b", train, axes=axes, top=100)
    # a sequence axis where the batch calls for it: 8 sequences cannot fill 32 chips' batch
    # axes; 64 can, and there it is left out
    roles = ("model", "seq") if batch == 8 else ("model",)
    if batch == 64:
        assert not any(c.estimate.mesh.get("seq", 1) > 1 for c in ranking)
    for role in roles:
        assert any(
            c.estimate.pipeline is not None and c.estimate.mesh.get(role, 1) > 1 for c in ranking
        ), role


def test_pipeline_beside_moe_layers_and_expert_axis_searched():
    # MoE layers in the stages and an expert axis beside the pipeline are priced
    # (cost/pipeline/stages.py), so such meshes are searched and ranked, none pruned for them
    train = TrainSpec(global_batch=64)
    axes = ("pipeline", "fsdp", "expert")
    ranking = choose_mesh("tpu-v5p-64", "mixtral-8x7b", train, axes=axes, top=200)
    assert not any("pipeline" in reason for reason in ranking.pruned)
    staged = [c.estimate for c in ranking if c.estimate.pipeline is not None]
    assert any(e.mesh.get("expert", 1) > 1 for e in staged)


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


# -- the default search: pipelines wholly across granules (cost/choose_pipeline.dcn_pipelines)


def _plain(ranking):
    return [c for c in ranking if c.estimate.pipeline is None]


def test_default_search_adds_pipelines_across_granules_and_keeps_the_rest():
    # 4 x v5p-128 over a 1 Gbps DCN: the default axes (no pipeline named) now search stages
    # across slices too, and a pipeline wins for what it saves on the DCN
    train = TrainSpec(global_batch=256)
    # (top 40: the pipelined meshes, beside fsdp and the tensor axis, fill the first places)
    ranking = choose_mesh("tpu-v5p-128-4", "llama2-70b", train, top=40, facts=SLOW_DCN)
    explicit = choose_mesh(
        "tpu-v5p-128-4", "llama2-70b", train, axes=AXES_DEFAULT, top=40, facts=SLOW_DCN
    )
    assert ranking.stages == (2, 4)  # the divisors of 4 slices that divide 80 layers
    assert explicit.stages == () and explicit.with_pipeline is None
    best = ranking[0]
    p = best.estimate.pipeline
    assert p is not None and best.plan.axis_names[0] == "pipeline"
    assert (best.ici[0], best.dcn[0]) == (1, p.stages)  # each stage over whole slices
    # meshes without a pipeline rank as the search without pipelines ranks them
    plain = _plain(ranking)
    assert plain and [c.estimate for c in plain] == [c.estimate for c in explicit[: len(plain)]]
    assert ranking.without_pipeline.estimate == explicit[0].estimate
    assert ranking.with_pipeline is best
    # why it wins: less time across slices than the bubble adds to compute
    s, w = best.estimate, ranking.without_pipeline.estimate
    saved = w.time.across_granules - s.time.across_granules
    assert saved > s.time.compute - w.time.compute > 0
    text = ranking_text(ranking)
    assert "pipelines  searched across granules: 2, 4 stages" in text
    assert f"with       1. {_mesh(s)} pp{p.stages} M{p.microbatches} R{p.repeats}: bubble" in text
    assert f"bubble {p.bubble:.1%}" in text and "stage-to-stage" in text
    assert f"the pipeline wins by {w.step_seconds - s.step_seconds:.2f} s" in text


@pytest.mark.slow  # about 2 s of CPU for the search (16,384 chips)
def test_405b_on_8_slices_default_search_weighs_a_pipeline_and_says_why_it_loses():
    # 8 x v5p-2048 at the catalogue's DCN: 2, 4 and 8 stages over whole slices (126 layers: 4
    # and 8 stages take the last 124 and 120, the first with the pipeline axis as data); the
    # bubble costs more than the DCN it saves
    train = TrainSpec(global_batch=8192)
    ranking = choose_mesh("tpu-v5p-2048-8", "llama3-405b", train)
    assert ranking.stages == (2, 4, 8)
    assert ranking[0].estimate.pipeline is None
    staged = ranking.with_pipeline
    p = staged.estimate.pipeline
    assert (staged.ici[0], staged.dcn[0]) == (1, p.stages)
    assert p.layers == {2: 126, 4: 124, 8: 120}[p.stages] == staged.estimate.train.pipeline_layers
    assert p.lead == 126 - p.layers
    assert p.bubble == pytest.approx(1 / (p.microbatches * p.repeats + 1)) and p.bubble > 0
    s, w = staged.estimate, ranking.without_pipeline.estimate
    assert w is ranking[0].estimate
    assert s.time.compute - w.time.compute > s.time.across_granules - w.time.across_granules
    text = ranking_text(ranking)
    assert "pipelines  searched across granules: 2, 4, 8 stages" in text
    assert f"the pipeline loses by {s.step_seconds - w.step_seconds:.2f} s" in text
    assert f"bubble {p.bubble:.1%}" in text


H100_64 = "gpu-p5.48xlarge-512"  # 64 hosts of 8 H100s, each host an NVLink domain


def test_64_h100_hosts_pipeline_wins_over_a_slow_network_and_loses_on_the_catalogue_one():
    train = TrainSpec(global_batch=512)
    fast = choose_mesh(H100_64, "llama3-70b", train)
    slow = choose_mesh(H100_64, "llama3-70b", train, facts={"network_per_gpu": "10 Gbps"})
    for ranking in (fast, slow):
        assert ranking.stages == (2, 4, 8, 16)  # the divisors of 64 hosts that divide 80 layers
    # catalogue network (400 Gb/s a GPU): FSDP across hosts costs about what the stages
    # move across them, and the bubble's compute decides
    s, w = fast.with_pipeline.estimate, fast.without_pipeline.estimate
    assert fast[0].estimate.pipeline is None and s.step_seconds > w.step_seconds
    assert s.time.compute - w.time.compute > s.time.across_granules - w.time.across_granules
    assert "the pipeline loses by" in ranking_text(fast)
    # 10 Gb/s a GPU: FSDP's weight gathers across hosts wait; the stages' activations less
    best = slow[0]
    p = best.estimate.pipeline
    assert p is not None and (best.ici[0], best.dcn[0]) == (1, p.stages)
    w = slow.without_pipeline.estimate
    fsdp_dcn = w.axes["fsdp"].dcn_seconds
    assert fsdp_dcn > best.estimate.time.across_granules
    assert "the pipeline wins by" in ranking_text(slow)


def test_64_h100_hosts_405b_searches_two_stages_that_fit_with_a_tensor_axis_and_lose():
    # 126 layers: 2 stages take them all, 4 and 8 the last 124 and 120 (16 would leave 14);
    # beside a pipeline no offload is priced, so a stage of 405B fits an 80 GB H100 only with
    # its layers cut over a tensor axis too; the plain meshes offload instead, and the pipeline
    # loses for its bubble and its traffic across hosts
    ranking = choose_mesh(H100_64, "llama3-405b", TrainSpec(global_batch=2048), top=3)
    assert ranking.stages == (2, 4, 8)
    staged = ranking.with_pipeline
    assert staged is not None and staged.estimate.pipeline.stages > 1
    assert staged.plan.shape["model"] > 1 and staged.train.remat_text == "full"
    s, w = staged.estimate, ranking.without_pipeline.estimate
    assert w is ranking[0].estimate and s.step_seconds > w.step_seconds
    assert s.time.compute > w.time.compute
    text = ranking_text(ranking)
    assert f"the pipeline loses by {s.step_seconds - w.step_seconds:.2f} s" in text


def test_a_batch_too_small_for_every_fitting_mesh_is_named():
    # 8 rows over 512 H100s: the data-parallel degree is at most 8, so tensor or sequence axes
    # would span hosts or 405B would not fit; the error names global_batch and what fits
    model, train = "llama3-405b", TrainSpec(global_batch=8)
    with pytest.raises(MeshConfigError, match=r"global_batch=8 is too small") as err:
        choose_mesh(H100_64, model, train)
    found = re.search(r"e\.g\. global_batch=(\d+)", str(err.value))
    assert found, err.value
    accepted = int(found.group(1))
    assert accepted % 8 == 0 and accepted > 8
    ranking = choose_mesh(H100_64, model, TrainSpec(global_batch=accepted), top=1)
    assert ranking[0].plan.data_parallel_size > 8
    with pytest.raises(MeshConfigError, match="global_batch="):
        choose_mesh(H100_64, model, TrainSpec(global_batch=accepted // 2))


def _mesh(e):
    return " x ".join(f"{a}={n}" for a, n in e.mesh.items() if n > 1)


@pytest.mark.parametrize(
    ("model", "stages", "layers"),
    [("llama3-405b", 2, 126), ("llama3-405b", 8, 120), ("llama3-405b", 16, 0),
     ("deepseek-v3", 8, 56), ("deepseek-v3", 2, 58), ("mixtral-8x7b", 8, 32),
     ("llama3-70b", 16, 80), ("llama3-70b", 32, 0)],
)  # fmt: skip
def test_stages_that_do_not_divide_the_layers_take_the_most_last_layers_they_divide(
    model, stages, layers
):
    """The chooser's pipeline beside layers that do not divide (docs/design.md section 16):
    the last layers of one kind that the stages divide (DeepSeek-V3's 3 dense layers, then
    58 MoE ones), at most a stage's share left before the pipeline (405B's 126 over 16
    stages would leave 14, 70B's 80 over 32 leave 16: not searched); a count the user gives
    is kept."""
    spec = ModelSpec.from_name(model)
    assert dividing_layers(spec, stages) == layers
    r = roles((("pipeline", stages), ("fsdp", 8)), ("fsdp",))
    train = for_mesh(spec, TrainSpec(global_batch=128), r)
    assert train.pipeline_layers == (0 if layers in (0, spec.num_layers) else layers)
    if layers:
        check_fit(spec, train, r)  # the stages it implies are ones the step takes
    pinned = TrainSpec(global_batch=128, pipeline_layers=stages * 2)
    assert for_mesh(spec, pinned, r).pipeline_layers == stages * 2


def test_1f1b_is_searched_where_gpipe_does_not_fit_and_the_ranking_says_what_it_saves():
    """LLaMA-3 70B, 2048 sequences on 64 H100 hosts over 25 Gb/s: the fastest pipelined mesh
    runs 1F1B under full remat, GPipe's schedule at the same recipe being over the device's
    limit (1F1B's step is GPipe's or slower: it wins by fitting); pinned to GPipe, the search
    keeps it. (At 10 Gb/s a GPipe mesh that fits wins: 1F1B's head sums its stages' outputs
    over the pipeline axis, cost/pipeline/traffic.py `_head`.)"""
    slow, train = {"network_per_gpu": "25 Gbps"}, TrainSpec(global_batch=2048)
    ranking = choose_mesh(H100_64, "llama3-70b", train, facts=slow, top=2)
    staged = ranking.with_pipeline
    assert staged.train.pipeline_schedule == "1f1b" and staged.train.remat == "full"
    held, gpipe = ranking.schedule_saves
    assert held == staged.estimate.memory_bytes < ranking.device.hbm_bytes * 0.9 < gpipe
    assert "schedule   1F1B: a stage holds" in ranking_text(ranking)
    pinned = [{"pipeline_schedule": "gpipe"}]
    kept = choose_mesh(H100_64, "llama3-70b", train, facts=slow, top=2, recipes=pinned)
    assert kept.with_pipeline.train.pipeline_schedule == "gpipe" and kept.schedule_saves is None
