"""The 1F1B schedules in the cost model (docs/design.md section 16): the same bubble and stages
as GPipe at the same micro-batches and repeats, the head on the replica's rows (the last
stage's tick), a stage keeping the items in flight (workload/timetable.py) instead of every
iteration's, so less memory the more micro-batches."""

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
def test_1f1b_costs_gpipes_time_and_the_head_on_every_stage_with_less_memory(repeats):
    """The same bubble and stages; the head on the replica's rows, not on its share of them
    split over the S stages: S - 1 times more of it on the step's critical path (the last
    stage computes each micro-batch's loss in its tick while the others wait)."""
    gpipe, one = _estimate("gpipe", repeats=repeats), _estimate("1f1b", repeats=repeats)
    assert one.pipeline is not None and one.pipeline.schedule == "1f1b"
    assert one.pipeline.bubble == gpipe.pipeline.bubble
    # 256 rows over fsdp 16 x 4 stages: 4 rows of 8192 tokens a device outside the stages
    head = 4 * MODEL.seq_len * 2 * MODEL.vocab_size * MODEL.d_model * 3
    assert one.flops - gpipe.flops == pytest.approx(3 * head, rel=1e-9)
    # its time: more than the extra FLOPs take at v5p's peak (459 TFLOP/s), less than 2.5x
    # that (the matmuls' share of the peak, the loss's passes over the logits)
    at_peak = 3 * head / 459e12
    assert at_peak < one.step_seconds - gpipe.step_seconds < 2.5 * at_peak
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
