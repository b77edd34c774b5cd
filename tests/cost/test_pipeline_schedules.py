"""The 1F1B schedules in the cost model (docs/design.md section 16): the same bubble, stages and
work as GPipe at the same micro-batches and repeats, the head's sums over the pipeline axis
(each stage's slice of the vocabulary in the last stage's tick), a stage keeping the items in
flight (workload/timetable.py) instead of every iteration's, so less memory the more
micro-batches."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.pipeline.memory import in_flight
from loadax_mesh.workload import ModelSpec, TrainSpec

HW = "tpu-v5p-128"
MODEL = ModelSpec.from_name("llama3-8b")


def _estimate(schedule: str, *, repeats: int = 1, micro: int = 16, batch: int = 256):
    config = MeshConfig((4, 16), ("pipeline", "fsdp"), batch_axis_names=("fsdp",))
    plan = config.plan(simulate_devices(HW), selector=HW)
    train = TrainSpec(
        global_batch=batch,
        pipeline_microbatches=micro,
        pipeline_repeats=repeats,
        pipeline_schedule=schedule,
    )
    return estimate(plan, MODEL, train)


def test_a_1f1b_stage_keeps_the_items_in_flight_not_the_micro_batches():
    assert in_flight(4, 1, 16) == in_flight(4, 1, 64) == 2 * 4 - 1 + 1
    assert in_flight(4, 2, 16) < 2 * 16


@pytest.mark.parametrize("repeats", [1, 2])
def test_1f1b_costs_gpipes_work_and_the_heads_sums_with_less_memory(repeats):
    """The same bubble, stages and FLOPs (each stage computes its slice of the vocabulary's
    logits for every micro-batch: GPipe's head work a device); the pipeline axis sums each
    micro-batch's output to every stage and its gradient back in float32, and the loss's
    maxima, sums and target logits, where GPipe takes its results back to the step's layout
    and their gradient to the last stage in bfloat16."""
    gpipe, one = _estimate("gpipe", repeats=repeats), _estimate("1f1b", repeats=repeats)
    assert one.pipeline is not None and one.pipeline.schedule == "1f1b"
    assert one.pipeline.bubble == gpipe.pipeline.bubble
    assert one.flops == pytest.approx(gpipe.flops, rel=1e-12)
    # 256 rows over fsdp 16: 16 rows a stage, 16 micro-batches of one row of 8192 tokens
    tokens, m = MODEL.seq_len, 16
    sums = m * (2 * tokens * MODEL.d_model * 4 + 3 * tokens * 4)
    results = 2 * m * tokens * MODEL.d_model * 2
    moved = one.axes["pipeline"].bytes - gpipe.axes["pipeline"].bytes
    assert moved == pytest.approx(sums - results, rel=1e-9)
    assert 1.0 < one.step_seconds / gpipe.step_seconds < 1.1
    assert one.terms["activations"] < gpipe.terms["activations"] / 2
    assert one.memory_bytes < gpipe.memory_bytes
    assert one.train.pipeline_schedule == "1f1b"


def test_more_micro_batches_cost_gpipe_memory_and_1f1b_none():
    """GPipe keeps every iteration's inputs, 1F1B the items in flight: at 4x the micro-batches
    (each a quarter the rows) GPipe keeps (M + S - 1) / M of the rows' inputs, 67/64 against
    19/16, 1F1B a quarter of what it kept."""
    few, many = (_estimate("gpipe", micro=m, batch=1024) for m in (16, 64))
    one_few, one_many = (_estimate("1f1b", micro=m, batch=1024) for m in (16, 64))
    assert many.terms["activations"] > 0.85 * few.terms["activations"]
    assert one_many.terms["activations"] < 0.4 * one_few.terms["activations"]


def test_the_chooser_keeps_the_schedule_it_is_given():
    """The schedule is the user's (or a recipe's), not searched."""
    from loadax_mesh.cost import choose_mesh

    for schedule in ("gpipe", "1f1b"):
        train = TrainSpec(global_batch=256, pipeline_schedule=schedule)
        ranking = choose_mesh(HW, MODEL, train, axes=("pipeline", "fsdp"))
        staged = [c for c in ranking if c.estimate.pipeline is not None]
        assert staged, [c.plan.shape for c in ranking]
        assert all(c.estimate.pipeline.schedule == schedule for c in staged)
