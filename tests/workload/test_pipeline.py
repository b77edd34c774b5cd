"""Pipeline stages in the reference step (docs/design.md section 12): on 8 CPU devices the
pipelined step (GPipe and circular, dense and MoE, every layer or the last few pipelined)
trains to one device's losses; its gradients are one device's; its program sends activations
between stages by collective-permutes on the pipeline axis; the fields that do not fit are
refused, naming the field; the cost model refuses what it does not price yet."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.replica_groups import group_axes
from loadax_mesh.cost import choose_mesh, estimate
from loadax_mesh.workload import TrainSpec
from loadax_mesh.workload.layout import check_fit, roles, stages_of
from loadax_mesh.workload.pipeline import from_stages, to_stages
from loadax_mesh.workload.step import make_step
from loadax_mesh.workload.timetable import one_f_one_b

from .losses import TINY, step_losses
from .test_moe import MOE

PIPE = ("pipeline", "fsdp")
# Four dense layers; eight for four stages of two repeats (a layer a chunk).
DENSE4, DENSE8 = replace(TINY, num_layers=4), replace(TINY, num_layers=8)
MOE4, MOE8 = replace(MOE, num_layers=4), replace(MOE, num_layers=8)
# DeepSeek's form: two dense layers first, then MoE layers with a shared expert (pipelined:
# pipeline_layers=4). (Without the shared expert its losses part from one device's by 1e-5 at
# the third step on a plain fsdp 8 mesh too: the learned routing's sensitivity, no pipeline's.)
LEADING = replace(
    MOE, name="tiny-leading", num_layers=6, first_dense_layers=2, num_shared_experts=1
)
ONE_F_ONE_B = {"pipeline_schedule": "1f1b"}
INTERLEAVED = {"pipeline_schedule": "1f1b", "pipeline_repeats": 2}


def plan(shape, names=PIPE, batch=("fsdp",)):
    return MeshConfig(shape, names, batch_axis_names=batch).plan()


@pytest.fixture(scope="module")
def single():
    return MeshConfig((1,), ("data",)).plan(jax.devices()[:1])


def losses(p, model, batch=8, **fields):
    train = TrainSpec(global_batch=batch, learning_rate=1e-2, compute_dtype="float32", **fields)
    return step_losses(p, model, train, batch_axes=p.batch_axis_names, steps=3)


# Measured spread against one device over three float32 steps: below 5e-7.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "shape", "fields"),
    [
        (DENSE4, (2, 4), {}),
        (DENSE8, (4, 2), {"pipeline_repeats": 2}),
        # more micro-batches than stages: in the circular schedule each waits M - S iterations
        # on the first stage before its next repeat
        (DENSE4, (2, 4), {"batch": 16, "pipeline_microbatches": 4}),
        (DENSE8, (2, 4), {"batch": 16, "pipeline_microbatches": 4, "pipeline_repeats": 2}),
        (MOE4, (2, 4), {}),
        (MOE8, (4, 2), {"pipeline_repeats": 2}),
        (replace(TINY, num_layers=6), (2, 4), {"pipeline_layers": 4, "pipeline_repeats": 2}),
        (LEADING, (4, 2), {"pipeline_layers": 4}),
        # one checkpoint an iteration (MaxText's remat): the chunk's layers unrolled in it
        (DENSE8, (2, 4), {"pipeline_remat": "iteration"}),
        (MOE8, (2, 4), {"pipeline_repeats": 2, "pipeline_remat": "iteration"}),
        # 1F1B (pipeline_1f1b.py): plain, interleaved (repeats 2), more micro-batches than
        # stages, MoE, after leading layers, the chunk's input alone kept
        (DENSE4, (2, 4), ONE_F_ONE_B),
        (DENSE8, (4, 2), INTERLEAVED),
        (DENSE4, (2, 4), {"batch": 16, "pipeline_microbatches": 4, **ONE_F_ONE_B}),
        (DENSE8, (2, 4), {"batch": 16, "pipeline_microbatches": 4, **INTERLEAVED}),
        (MOE4, (2, 4), ONE_F_ONE_B),
        (MOE8, (4, 2), INTERLEAVED),
        (LEADING, (4, 2), {"pipeline_layers": 4, **ONE_F_ONE_B}),
        (MOE8, (2, 4), {"pipeline_remat": "iteration", **INTERLEAVED}),
    ],
    ids=[
        "gpipe",
        "circular",
        "gpipe-4-micro",
        "circular-4-micro",
        "moe-gpipe",
        "moe-circular",
        "last-4-of-6",
        "moe-after-dense",
        "iteration-remat",
        "moe-circular-iteration-remat",
        "1f1b",
        "1f1b-interleaved",
        "1f1b-4-micro",
        "1f1b-interleaved-4-micro",
        "moe-1f1b",
        "moe-1f1b-interleaved",
        "moe-1f1b-after-dense",
        "moe-1f1b-interleaved-iteration-remat",
    ],
)
def test_the_pipelined_step_trains_like_one_device(single, model, shape, fields):
    pipelined = plan(shape)
    assert pipelined.devices.size == 8
    got = losses(pipelined, model, **fields)
    # float32 sums in another order across 8 devices: the MoE cases differ from one device's by
    # up to 4e-5 (relative) on this CPU by the third step, at ec3d4dd too; a wrong gradient or a
    # lost micro-batch moves the loss by more than 1e-2
    np.testing.assert_allclose(got, losses(single, model, **fields), rtol=1e-4)
    assert (np.diff(got) < 0).all(), got


@pytest.mark.slow
@pytest.mark.parametrize("inner", ["tensor", "seq"])
def test_a_stage_split_over_tensor_or_sequence_trains_like_one_device(single, inner):
    """Inside a stage the fused attention runs under a shard_map manual over the other axes
    too (attention.py: jax's cuDNN partitioner cannot run there): each device on its rows and
    heads (the tensor axis splitting the grouped query and key heads), the sequence whole."""
    pipelined = plan((2, 2, 2), ("pipeline", "fsdp", inner))
    got = losses(pipelined, DENSE4)
    np.testing.assert_allclose(got, losses(single, DENSE4), rtol=1e-5)
    assert (np.diff(got) < 0).all(), got


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "shape", "fields"),
    [
        (replace(TINY, num_layers=6), (2, 4), {"pipeline_repeats": 2, "pipeline_layers": 4}),
        # 1F1B: more micro-batches than stages, 2 and 4 stages, interleaved, dense and MoE
        (DENSE4, (2, 4), {"batch": 16, "pipeline_microbatches": 4, **ONE_F_ONE_B}),
        (DENSE8, (2, 4), {"batch": 16, "pipeline_microbatches": 4, **INTERLEAVED}),
        (DENSE8, (4, 2), {"batch": 16, "pipeline_microbatches": 8, **INTERLEAVED}),
        (MOE8, (4, 2), {"batch": 16, "pipeline_microbatches": 8, **INTERLEAVED}),
        (
            LEADING,
            (2, 4),
            {"batch": 16, "pipeline_microbatches": 4, "pipeline_layers": 4, **ONE_F_ONE_B},
        ),
        # the head's table padded to a multiple of the stages (pipeline_1f1b.py)
        (replace(DENSE4, vocab_size=510), (4, 2), {"batch": 16, **ONE_F_ONE_B}),
    ],
    ids=[
        "gpipe-circular",
        "1f1b-4-micro",
        "1f1b-interleaved-4-micro",
        "1f1b-4x2-interleaved-8-micro",
        "moe-1f1b-4x2-interleaved-8-micro",
        "moe-1f1b-after-dense",
        "1f1b-vocabulary-the-stages-do-not-divide",
    ],
)
def test_the_pipelined_gradients_are_one_devices(single, model, shape, fields):
    """Every weight's gradient (the stage layout taken back to the stacks), not only the
    losses: GPipe's transposed ppermutes send each stage's gradient back to the one before;
    1F1B's backward slots do, and its custom VJP hands out what they summed."""
    fields = dict(fields)
    rows = fields.pop("batch", 8)
    train = TrainSpec(global_batch=rows, compute_dtype="float32", **fields)
    tokens = jax.random.randint(jax.random.key(1), (rows, model.seq_len), 0, model.vocab_size)

    def grads(p):
        step = make_step(p.to_jax_mesh(), model, train, batch_axes=p.batch_axis_names)
        params, _ = step.init(jax.random.key(0))
        put = step.batch_sharding
        data = {"tokens": jax.device_put(tokens, put)}
        data["targets"] = jax.device_put(jnp.roll(tokens, -1, axis=1), put)
        g = jax.jit(jax.grad(step.loss))(params, data)
        return g if step.stages is None else from_stages(g, step.stages)

    ours, theirs = grads(plan(shape)), grads(single)
    assert set(ours) == set(theirs)
    for name, g in theirs.items():
        np.testing.assert_allclose(ours[name], g, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("remat", "repeats", "where"),
    [("full", 1, "layer"), ("full", 2, "layer"), ("dots", 2, "layer"), ("full", 1, "iteration")],
)
def test_the_backward_pass_keeps_a_stages_weights_once_not_every_iteration(
    capsys, remat, repeats, where
):
    """What the backward pass saves of the pipelined layers' weights: the stage's chunks
    ([repeats x stages, per_chunk, ...] over the mesh), never the weights a layer picks from
    them once per iteration of the schedule ([iterations x stages, per_chunk, ...]: 1.5 GB
    a chip more on v5p-128 and 5 GB a GPU on 2 x 8 H100s for LLaMA-3 8B: docs/notes/,
    2026-11-29-maxtext-pipelined-export.md and 2026-11-29-pipeline-gpu-cudnn.md)."""
    p = plan((2, 4))
    train = TrainSpec(global_batch=8, remat=remat, pipeline_repeats=repeats, pipeline_remat=where)
    step = make_step(p.to_jax_mesh(), DENSE8, train, batch_axes=p.batch_axis_names)
    params, _, batch = step.abstract_args()
    jax.ad_checkpoint.print_saved_residuals(step.loss, params, batch)
    saved = [
        tuple(int(n) for n in m.group(1).split(","))
        for m in re.finditer(r"^f32\[([\d,]+)\]", capsys.readouterr().out, re.M)
    ]
    st = step.stages
    assert st is not None and st.iterations > st.repeats
    matrices = {k: w for k, w in params.items() if k.startswith("stages/") and w.ndim > 4}
    assert matrices
    for name, w in matrices.items():
        layer = w.shape[3:]  # [repeats, stages, per_chunk, *layer]
        kept = [s[:2] for s in saved if len(s) == w.ndim - 1 and s[2:] == layer]
        assert kept, name  # the chunks are kept (the backward pass reads them)
        assert all(math.prod(k) <= math.prod(w.shape[:3]) for k in kept), (name, kept)


@pytest.mark.slow
def test_one_checkpoint_an_iteration_saves_what_a_checkpoint_a_layer_saves(capsys):
    """pipeline_remat "iteration" keeps each layer's input as the per-layer checkpoint does
    (MaxText's decoder_layer_input): what the two save for the backward pass is the same; they
    differ only in what the backward pass recomputes at once (cost/pipeline/memory.py)."""
    p = plan((2, 4))

    def saved(where):
        train = TrainSpec(global_batch=8, pipeline_remat=where)
        step = make_step(p.to_jax_mesh(), DENSE8, train, batch_axes=p.batch_axis_names)
        jax.ad_checkpoint.print_saved_residuals(step.loss, *step.abstract_args()[::2])
        found = re.findall(r"^(\w+)\[([\d,]*)\]", capsys.readouterr().out, re.M)
        elements: dict[str, int] = {}  # by dtype: the unrolled chunk saves a layer's apart
        for dtype, dims in found:
            if dtype not in ("f32", "bf16"):  # the schedule's indices and flags differ
                continue
            n = math.prod(int(x) for x in dims.split(",") if x)
            elements[dtype] = elements.get(dtype, 0) + n
        return found, elements

    layer, layer_elements = saved("layer")
    assert ("bf16", "6,4,4,128,128") in layer  # iterations x per_chunk x a micro-batch's inputs
    iteration, iteration_elements = saved("iteration")
    assert iteration.count(("bf16", "6,4,128,128")) == 4  # the same, a layer at a time
    assert iteration_elements == layer_elements


@pytest.mark.slow
@pytest.mark.parametrize("repeats", [1, 2])
def test_stages_send_activations_by_collective_permutes_on_the_pipeline_axis(repeats):
    p = plan((4, 2))
    # float32: XLA:CPU sends bfloat16 as float32 (libtpu sends it as it is)
    train = TrainSpec(global_batch=8, pipeline_repeats=repeats, compute_dtype="float32")
    step = make_step(p.to_jax_mesh(), DENSE8, train, batch_axes=p.batch_axis_names)
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    shape = dict(step.mesh.shape)
    permutes = [c for c in collectives(hlo, 8) if c.kind == "collective-permute"]
    on_pipeline = [c for c in permutes if group_axes(c.groups, shape, pairs=True) == ("pipeline",)]
    # forward and backward: a micro-batch's activations on a device, [rows, seq, d_model]
    assert len(on_pipeline) >= 2, permutes
    rows = 8 // step.stages.microbatches // 2
    assert any(c.bytes == rows * TINY.seq_len * TINY.d_model * 4 for c in on_pipeline)
    # the schedule's loop runs M * R + S - 1 iterations: the bubble is in the program
    assert any(c.count == step.stages.iterations for c in on_pipeline), on_pipeline


@pytest.mark.slow
@pytest.mark.parametrize("repeats", [1, 2])
def test_1f1b_stages_send_activations_and_gradients_by_collective_permutes(repeats):
    """One permute forward a tick of the warm-up and steady loops, one backward a tick of the
    steady and cool-down ones (timetable.py): M R + S - 1 each way, as GPipe's."""
    p = plan((4, 2))
    train = TrainSpec(
        global_batch=16,
        pipeline_microbatches=8,
        pipeline_repeats=repeats,
        pipeline_schedule="1f1b",
        compute_dtype="float32",
    )
    step = make_step(p.to_jax_mesh(), DENSE8, train, batch_axes=p.batch_axis_names)
    hlo = HloText(step.fn.lower(*step.abstract_args()).compile().as_text())
    shape = dict(step.mesh.shape)
    rows = 16 // 8 // 2  # a micro-batch's rows on a device
    sent = sorted(
        c.count
        for c in collectives(hlo, 8)
        if c.kind == "collective-permute"
        and group_axes(c.groups, shape, pairs=True) == ("pipeline",)
        and c.bytes == rows * TINY.seq_len * TINY.d_model * 4
    )
    tt = one_f_one_b(4, repeats, 8)
    assert sent == sorted([tt.warmup, tt.steady, tt.steady, tt.cooldown]), sent
    assert tt.warmup + tt.steady == step.stages.iterations == 8 * repeats + 3


def test_the_interleaved_1f1b_schedule_takes_micro_batches_in_groups_of_the_stages():
    p = plan((2, 4))
    train = TrainSpec(
        global_batch=24, pipeline_microbatches=3, pipeline_repeats=2, pipeline_schedule="1f1b"
    )
    with pytest.raises(
        MeshConfigError,
        match=r"pipeline_microbatches=3 \(3 micro-batches\) with pipeline_schedule='1f1b' and "
        r"pipeline_repeats=2: .* groups of the 2 stages .*; accepted: a multiple of 2",
    ):
        make_step(p.to_jax_mesh(), DENSE8, train, batch_axes=p.batch_axis_names)
    # one repeat: any count of at least the stages
    assert (
        make_step(
            p.to_jax_mesh(), DENSE4, replace(train, pipeline_repeats=1), batch_axes=("fsdp",)
        ).stages.microbatches
        == 3
    )


def test_the_stage_layout_gives_stage_s_chunks_r_times_s_plus_s():
    p = plan((4, 2))
    train = TrainSpec(global_batch=8, pipeline_repeats=2, pipeline_layers=8)
    r = roles(tuple(p.shape.items()), p.batch_axis_names)
    st = stages_of(replace(TINY, num_layers=10), train, r)
    assert st is not None and (st.stages, st.repeats, st.per_chunk, st.lead) == (4, 2, 1, 2)
    assert st.iterations == 4 * 2 + 4 - 1
    stack = np.arange(10 * 3).reshape(10, 3)  # layer i's weight: row i
    staged = to_stages({"layers/w": stack, "embed": np.ones(2)}, st)
    assert staged["layers/w"].tolist() == stack[:2].tolist()  # the leading layers
    for stage in range(4):
        for repeat in range(2):
            layer = 2 + repeat * 4 + stage
            assert staged["stages/w"][repeat, stage, 0].tolist() == stack[layer].tolist()
    back = from_stages(staged, st)
    assert set(back) == {"layers/w", "embed"}
    np.testing.assert_array_equal(back["layers/w"], stack)


def test_the_pipeline_axis_has_the_pipeline_role():
    r = roles((("pipeline", 2), ("fsdp", 4)), ("fsdp",))
    assert r.pipeline == "pipeline" and r.size("pipeline") == 2 and r.batch == ("fsdp",)
    assert r.mesh_axes((None, "stage", None, "embed")) == (None, "pipeline", None, "fsdp")
    step = make_step(
        plan((2, 4)).to_jax_mesh(), DENSE4, TrainSpec(global_batch=8), batch_axes=("fsdp",)
    )
    # the batch comes in over the plan's batch axes; outside the pipelined layers the
    # pipeline axis splits it too
    assert step.batch_sharding.spec[0] == "fsdp"
    assert step.spec(("batch", "seq")).spec[0] == ("pipeline", "fsdp")
    assert step.param_shardings["stages/wq"].spec[:2] == (None, "pipeline")
    assert step.abstract_args()[0]["stages/wq"].shape == (1, 2, 2, 128, 8, 16)
    # a pipeline axis of size 1 is no pipeline: the fields are not read
    one = make_step(
        MeshConfig((1, 8), PIPE, batch_axis_names=("fsdp",)).create_device_mesh(),
        DENSE4,
        TrainSpec(global_batch=8, pipeline_repeats=3),
        batch_axes=("fsdp",),
    )
    assert one.stages is None and "layers/wq" in one.param_shardings


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pipeline_microbatches": -1}, "pipeline_microbatches=-1; accepted: a non-negative"),
        ({"pipeline_repeats": 0}, "pipeline_repeats=0; accepted: a positive integer"),
        ({"pipeline_repeats": -2}, "pipeline_repeats=-2; accepted: a positive integer"),
        ({"pipeline_layers": -4}, "pipeline_layers=-4; accepted: a non-negative integer"),
        ({"pipeline_layers": 2.0}, "pipeline_layers=2.0; accepted: a non-negative integer"),
        ({"pipeline_remat": "chunk"}, "pipeline_remat='chunk'; accepted: layer, iteration"),
    ],
)
def test_a_train_spec_refuses_negative_pipeline_fields(fields, message):
    with pytest.raises(MeshConfigError, match=message):
        TrainSpec(global_batch=8, **fields)


@pytest.mark.parametrize(
    ("model", "shape", "fields", "message"),
    [
        (
            replace(TINY, num_layers=6),
            (4, 2),
            {},
            r"pipeline_layers=0 \(6 layers pipelined\) does not divide into 4 stages "
            r"\(pipeline axis 'pipeline'\) x pipeline_repeats=1 chunks; accepted: a layer "
            "count that is a multiple of 4",
        ),
        (
            DENSE8,
            (2, 4),
            {"pipeline_repeats": 3},
            r"pipeline_layers=0 \(8 layers pipelined\) does not divide into 2 stages .* x "
            "pipeline_repeats=3 chunks",
        ),
        (
            DENSE8,
            (2, 4),
            {"pipeline_layers": 3},
            r"pipeline_layers=3 \(3 layers pipelined\) does not divide",
        ),
        (
            DENSE4,
            (2, 4),
            {"pipeline_layers": 6},
            "pipeline_layers=6 is more than the num_layers=4 of model 'tiny'; accepted: 0",
        ),
        (
            DENSE4,
            (4, 2),
            {"pipeline_microbatches": 2},
            "pipeline_microbatches=2 is fewer than the 4 stages of the pipeline axis "
            "'pipeline'; accepted: 0 .as many as stages. or at least 4",
        ),
        (
            DENSE4,
            (2, 4),
            {"pipeline_microbatches": 3},
            r"pipeline_microbatches=3 \(3 micro-batches\) does not divide the batch each stage "
            r"sees, 8 rows, into micro-batches its batch axes \(fsdp: 4\) split evenly; "
            r"accepted: 0 or a count of at least 2 that divides 2 \(the rows of a batch shard\), "
            r"e.g. \[2\]",
        ),
        (
            replace(MOE, num_layers=4, first_dense_layers=1, moe_every=2),
            (2, 4),
            {"pipeline_layers": 2},
            "pipeline_layers=2: model 'tiny-moe'.s last 2 layers mix dense and MoE layers.*"
            r"accepted: a count of last layers all of one kind \(up to 1\)",
        ),
    ],
)
def test_pipeline_fields_that_do_not_fit_the_plan_are_refused(model, shape, fields, message):
    p = plan(shape)
    train = TrainSpec(global_batch=8, **fields)
    with pytest.raises(MeshConfigError, match=message):
        make_step(p.to_jax_mesh(), model, train, batch_axes=p.batch_axis_names)


def test_the_pipeline_axis_is_no_batch_axis_and_the_batch_must_split_over_it():
    r = roles((("pipeline", 2), ("fsdp", 4)), ("pipeline", "fsdp"))
    with pytest.raises(
        MeshConfigError,
        match=r"batch_axis_names \['pipeline', 'fsdp'\] include the pipeline axis 'pipeline' "
        r"\(size 2\).*accepted: batch axes without it",
    ):
        check_fit(DENSE4, TrainSpec(global_batch=8), r)
    r = roles((("pipeline", 2), ("fsdp", 4)), ("fsdp",))
    with pytest.raises(
        MeshConfigError,
        match=r"global_batch=4 .* does not divide over the pipeline axis 'pipeline' \(2\) and "
        r"the batch axes \(4\).*accepted: a multiple of 8",
    ):
        check_fit(DENSE4, TrainSpec(global_batch=4), r)


def test_the_cost_model_prices_tensor_and_moe_stages():
    staged = MeshConfig.from_preset("pipeline_fsdp_tp", pp=2).plan(
        simulate_devices("tpu-v5p-128-2")
    )
    assert staged.shape["pipeline"] == 2
    model, train = replace(TINY, num_layers=4), TrainSpec(global_batch=64)
    e = estimate(staged, model, train)
    assert e.pipeline is not None and e.axes["model"].role == "tensor"
    assert e.axes["model"].bytes > 0
    moe = estimate(staged, MOE4, train)
    assert moe.pipeline is not None and moe.flops > 0
    # without stages the preset is priced as before
    flat = MeshConfig.from_preset("pipeline_fsdp_tp").plan(simulate_devices("tpu-v5p-128"))
    assert estimate(flat, model, train).memory_bytes > 0
    # the chooser searches stages where asked to (tests/cost/test_choose_pipeline.py)
    ranking = choose_mesh("tpu-v5p-128", model, train, axes=("pipeline", "fsdp"), top=50)
    assert any(c.plan.shape["pipeline"] > 1 for c in ranking)
