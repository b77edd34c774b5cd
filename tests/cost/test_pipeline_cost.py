"""The cost model's pipeline stages (cost/pipeline/stages.py), counted by hand. No jax needed."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.memory.terms import phases
from loadax_mesh.cost.pipeline.memory import pipeline_memory_floor, pipeline_memory_terms
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import roles, stages_of
from loadax_mesh.workload.stages import bubble

LONG = ModelSpec(
    name="long", num_layers=8, d_model=2048, d_ff=8192, num_heads=16, num_kv_heads=8,
    head_dim=128, vocab_size=32768, seq_len=2048,
)  # fmt: skip
MOE = replace(LONG, name="long-moe", num_experts=8, experts_per_token=2, moe_d_ff=2048)


def plan(hardware: str, **axes: int):
    names = tuple(axes)
    batch = tuple(a for a in names if a in ("data", "fsdp", "expert"))
    config = MeshConfig(mesh_shape=tuple(axes.values()), mesh_axis_names=names,
                        batch_axis_names=batch)  # fmt: skip
    return config.plan(simulate_devices(hardware), selector=hardware)


def test_the_bubble_is_the_idle_share_of_the_schedule() -> None:
    assert bubble(4, 4, 1) == pytest.approx(3 / 7)
    assert bubble(4, 4, 2) == pytest.approx(3 / 11)
    assert bubble(1, 8, 1) == 0
    train = TrainSpec(global_batch=64, pipeline_microbatches=8, pipeline_repeats=2)
    e = estimate(plan("tpu-v5p-64", pipeline=4, fsdp=8), LONG, train)
    assert e.pipeline is not None
    assert (e.pipeline.stages, e.pipeline.microbatches, e.pipeline.repeats) == (4, 8, 2)
    assert e.pipeline.iterations == 8 * 2 + 3
    assert e.pipeline.bubble == pytest.approx(3 / 19)
    assert e.axes["pipeline"].role == "pipeline"
    assert e.to_dict()["pipeline"]["bubble"] == pytest.approx(3 / 19)


def test_the_estimate_carries_the_recipe_it_priced() -> None:
    """Estimate.train is the recipe resolved: the defaults the stages decide filled in (0
    micro-batches means as many as stages), the rest as given; a plain step's as given."""
    train = TrainSpec(global_batch=64, remat="none", pipeline_remat="iteration")
    e = estimate(plan("tpu-v5p-64", pipeline=4, fsdp=8), LONG, train)
    assert e.train is not None and e.pipeline is not None
    assert (e.train.pipeline_microbatches, e.train.pipeline_layers) == (4, LONG.num_layers)
    assert e.train.pipeline_remat == "layer"  # remat none checkpoints no iteration either
    assert replace(e.train, pipeline_microbatches=0, pipeline_layers=0,
                   pipeline_remat="iteration") == train  # fmt: skip
    assert e.to_dict()["train"]["pipeline_microbatches"] == 4
    plain = estimate(plan("tpu-v5p-64", fsdp=32), LONG, replace(train, global_batch=32))
    assert plain.train == replace(train, global_batch=32)


@pytest.mark.parametrize("micro, repeats", [(4, 1), (8, 1), (4, 2)])
def test_the_bubble_computes_zeros_at_full_price(micro: int, repeats: int) -> None:
    """The pipelined layers' FLOPs are the plain step's (the pipeline axis as data) times
    (M R + S - 1) / (M R); the head's are the same."""
    S, V, d = 4, 32768, 2048
    train = TrainSpec(global_batch=64, pipeline_microbatches=micro, pipeline_repeats=repeats)
    piped = estimate(plan("tpu-v5p-64", pipeline=S, fsdp=8), LONG, train)
    plain = estimate(plan("tpu-v5p-64", data=S, fsdp=8), LONG, train)
    tokens = 64 // 32 * 2048  # a device's, split over data (or pipeline) and fsdp
    head = 3 * 2 * V * d * tokens  # full remat: the head is not recomputed
    layers = plain.flops - head
    assert piped.flops - head == pytest.approx(
        layers * (micro * repeats + S - 1) / (micro * repeats)
    )
    assert piped.model_flops == pytest.approx(plain.model_flops)


def test_a_stage_holds_its_layers_and_the_tables() -> None:
    """Parameters (float32) on one GPU (no tiles): the tables over fsdp, the final norm whole,
    and 1/S of the layers (their matrices over fsdp, their two norms whole)."""
    S, F = 2, 8
    e = estimate(plan("gpu-p5.48xlarge-16", pipeline=S, fsdp=F), LONG, TrainSpec(global_batch=16))
    d, V, L = 2048, 32768, 8
    matrices = (LONG.num_params - 2 * V * d - d) // L - 2 * d
    assert e.terms["params"] == 4 * ((2 * V * d) // F + d + L // S * (matrices // F + 2 * d))
    assert e.terms["optimizer"] == 2 * e.terms["params"]
    # every iteration saves its chunk's layer inputs (full remat): M + S - 1 iterations of
    # L / S layers, one micro-batch (16 / 8 rows a replica device, M = 2: one row) each
    assert e.terms["activations"] == (2 + 1) * (L // S) * 1 * 2048 * d * 2


@pytest.mark.parametrize("repeats", [1, 2, 4])
def test_one_checkpoint_an_iteration_holds_the_chunks_other_layers(repeats: int) -> None:
    """pipeline_remat "iteration" (MaxText's): beside the layer being differentiated, the
    chunk's other per_chunk - 1 layers hold their matmul and kernel outputs and the values those
    read (one GPU, a micro-batch of one row: bf16 rows x seq wide), never the float32 norm
    copies or the SwiGLU's by-products; saved, compute and traffic as a checkpoint a layer's."""
    S, seq, d, f, kv = 2, 2048, 2048, 8192, 8 * 128
    where = plan("gpu-p5.48xlarge-16", pipeline=S, fsdp=8)
    layer = TrainSpec(global_batch=16, pipeline_repeats=repeats)
    one = estimate(where, LONG, layer)
    block = estimate(where, LONG, replace(layer, pipeline_remat="iteration"))
    per_chunk = 8 // (S * repeats)
    # norm outputs x2, rotated q, rotated k, v, attention (cuDNN's, no copy in a kernel
    # layout), gate, up, gated, and the log-sum-exp (float32, a value a head and token)
    held = 2 * seq * (2 * d + d + kv + kv + d + 3 * f) + 4 * 16 * seq
    assert block.terms["iteration residuals"] == (per_chunk - 1) * held
    assert one.terms["iteration residuals"] == 0
    for name in set(one.terms) - {"iteration residuals"}:
        assert block.terms[name] == one.terms[name], name
    assert block.flops == one.flops
    assert block.axes["fsdp"].bytes == one.axes["fsdp"].bytes
    # remat "none" saves everything already: nothing more is held
    none = replace(layer, remat="none")
    assert (
        estimate(where, LONG, replace(none, pipeline_remat="iteration")).terms[
            "iteration residuals"
        ]
        == 0
    )


def test_the_stages_send_each_micro_batch_forward_and_back() -> None:
    train = TrainSpec(global_batch=256, pipeline_microbatches=8)
    e = estimate(plan("tpu-v5p-64", pipeline=4, fsdp=8), LONG, train)
    (permute,) = [c for c in e.axes["pipeline"].collectives if c.what.startswith("stage-to")]
    assert permute.kind == "collective-permute" and not permute.overlaps
    assert permute.bytes == 256 // 8 // 8 * 2048 * 2048 * 2  # a micro-batch's rows, bfloat16
    assert permute.count == 2 * (8 + 4 - 1)
    fewer = estimate(
        plan("tpu-v5p-64", pipeline=4, fsdp=8), LONG, replace(train, pipeline_microbatches=32)
    )
    assert fewer.time.seconds < e.time.seconds  # a smaller bubble


def test_a_pipeline_axis_of_one_changes_nothing() -> None:
    train = TrainSpec(global_batch=64, pipeline_microbatches=8, pipeline_repeats=2)
    with_axis = estimate(plan("tpu-v5p-64", pipeline=1, fsdp=32), LONG, train)
    without = estimate(plan("tpu-v5p-64", fsdp=32), LONG, train)
    assert with_axis.pipeline is None
    assert with_axis.axes.pop("pipeline").bytes == 0
    assert replace(with_axis, mesh=without.mesh) == without


@pytest.mark.parametrize(
    "axes, model, fields, named",
    [
        ({"pipeline": 2, "fsdp": 8}, LONG, {"remat": "offload"}, "remat="),
        ({"pipeline": 2, "fsdp": 8}, LONG, {"pipeline_repeats": 3}, "pipeline_repeats=3"),
    ],
)
def test_what_is_not_priced_is_refused_by_name(axes, model, fields, named) -> None:
    with pytest.raises(MeshConfigError, match=named):  # the refusal names what is not priced
        estimate(plan("tpu-v5p-32", **axes), model, TrainSpec(global_batch=64, **fields))


def _axis_bytes(e, axis: str, stages: bool) -> int:
    """Bytes of the axis's activation collectives run in the stages (or outside them)."""
    return sum(
        c.bytes * c.count
        for c in e.axes[axis].collectives
        if c.what.endswith(" in the stages") == stages and "weight" not in c.what
    )


@pytest.mark.parametrize(
    "hardware, axis, micro, repeats",
    [
        ("tpu-v5p-32", "model", 2, 1),
        ("tpu-v5p-32", "model", 4, 2),
        ("gpu-p5.48xlarge-16", "model", 2, 1),  # no overlap: every collective waits
        ("tpu-v5p-32", "seq", 2, 1),
        ("tpu-v5p-32", "seq", 4, 2),
    ],
)
def test_a_stage_runs_the_activation_collectives_of_its_layer_passes(
    hardware: str, axis: str, micro: int, repeats: int
) -> None:
    """Tensor and sequence axes beside the pipeline: a stage's layer passes (per_chunk of one
    micro-batch each of the M R + S - 1 iterations, the bubble's included) each run a plain
    layer's activation collectives, and the head runs its own, on rows split over the pipeline
    axis too. The plain step (the pipeline axis as data) prices a layer's: its bytes at 8
    layers less those at 4, over 4."""
    S, L = 2, 8
    train = TrainSpec(global_batch=64, pipeline_microbatches=micro, pipeline_repeats=repeats)
    piped = estimate(plan(hardware, pipeline=S, fsdp=4, **{axis: 2}), LONG, train)
    flat = plan(hardware, data=S, fsdp=4, **{axis: 2})
    plain = {n: estimate(flat, replace(LONG, num_layers=n), train).axes[axis].bytes for n in (4, L)}
    layer = (plain[L] - plain[4]) // 4  # one layer's, on the batch / (S fsdp) rows
    # a stage's pass moves a micro-batch of batch / (fsdp M) rows: S / M times a plain
    # layer's bytes, per_chunk (M R + S - 1) passes
    stage_passes = L // (S * repeats) * (micro * repeats + S - 1)
    assert _axis_bytes(piped, axis, True) == layer * S // micro * stage_passes
    assert _axis_bytes(piped, axis, False) == plain[L] - L * layer  # the head's (no lead layers)
    assert piped.axes[axis].role == ("tensor" if axis == "model" else "sequence")
    # the sequence axis shards the weights with fsdp: their collectives span both, counted on
    # fsdp (parts/traffic.py's shard_axis); none on the tensor or sequence axis itself
    assert not [c for c in piped.axes[axis].collectives if "weight" in c.what]
    assert piped.axes[axis].exposed_seconds > 0


def test_the_tensor_axis_cuts_a_stage_and_its_activations() -> None:
    """GPU (no memory tiles): a tensor axis of 2 beside the pipeline halves a stage's saved
    activations and the pipeline's buffers (the hidden dim of the residual stream cut), cuts
    its layer matrices, and halves what the stages send one another."""
    train = TrainSpec(global_batch=16, pipeline_microbatches=4)
    one = estimate(plan("gpu-p5.48xlarge-8", pipeline=2, fsdp=4), LONG, train)
    two = estimate(plan("gpu-p5.48xlarge-16", pipeline=2, fsdp=4, model=2), LONG, train)
    for term in ("activations", "pipeline buffers"):
        assert two.terms[term] * 2 == one.terms[term]
    assert two.terms["params"] < 0.6 * one.terms["params"]  # the norms stay whole
    assert two.memory_bytes < one.memory_bytes

    def permute(e):
        (c,) = [c for c in e.axes["pipeline"].collectives if c.what.startswith("stage-to")]
        return c.bytes

    assert permute(two) * 2 == permute(one) == 16 // 4 // 4 * 2048 * 2048 * 2
    assert two.flops == pytest.approx(one.flops / 2)


@pytest.mark.parametrize("micro, repeats", [(2, 1), (4, 2)])
def test_a_stage_runs_the_expert_exchanges_of_its_moe_layer_passes(micro: int, repeats: int):
    """An expert axis beside the pipeline: each of a stage's MoE layer passes (per_chunk of a
    micro-batch each iteration, the bubble's included) runs a plain MoE layer's all-to-alls on
    a pipeline micro-batch's rows. The plain step whose micro-batches hold as many rows (fsdp x
    expert, M micro-batches) prices a layer's: its expert bytes over L M."""
    S, L = 2, 8
    train = TrainSpec(global_batch=64, pipeline_microbatches=micro, pipeline_repeats=repeats)
    piped = estimate(plan("tpu-v5p-32", pipeline=S, fsdp=4, expert=2), MOE, train)
    flat = estimate(plan("tpu-v5p-16", fsdp=4, expert=2), MOE, replace(train, microbatches=micro))
    layer = flat.axes["expert"].bytes // (L * micro)  # a MoE layer's, on a micro-batch's rows
    passes = L // (S * repeats) * (micro * repeats + S - 1)
    assert piped.axes["expert"].bytes == layer * passes > 0
    assert all(c.what.endswith(" in the stages") for c in piped.axes["expert"].collectives)
    # ... and a stage gathers its experts over fsdp on every pass, forward and backward
    (gathers,) = [c for c in piped.axes["fsdp"].collectives if c.what == "expert weights"]
    (plain,) = [c for c in flat.axes["fsdp"].collectives if c.what == "expert weights"]
    assert (gathers.bytes, gathers.count) == (plain.bytes, 2 * passes)


def test_moe_stages_are_priced_with_their_experts() -> None:
    """MoE layers in the stages: no refusal; a stage holds its half of the layers, experts
    included (the parameters less than 0.6 of the plain step's with the pipeline axis as data:
    only the tables stay whole), saves a MoE layer's block for each pass, and computes its
    routed experts' FLOPs."""
    train = TrainSpec(global_batch=64)
    piped = estimate(plan("tpu-v5p-32", pipeline=2, fsdp=8), MOE, train)
    flat = estimate(plan("tpu-v5p-32", data=2, fsdp=8), MOE, train)
    dense = estimate(plan("tpu-v5p-32", pipeline=2, fsdp=8), LONG, train)
    assert piped.pipeline is not None and piped.pipeline.stages == 2
    assert flat.terms["params"] / 2 < piped.terms["params"] < 0.6 * flat.terms["params"]
    assert piped.terms["stage weights"] > dense.terms["stage weights"]
    assert piped.flops > dense.flops
    assert piped.model_flops == pytest.approx(flat.model_flops)


@pytest.mark.parametrize(
    "hardware, model, axes",
    [
        ("tpu-v5p-32", LONG, {"pipeline": 2, "fsdp": 8}),
        ("tpu-v5p-32", MOE, {"pipeline": 2, "fsdp": 4, "expert": 2}),
        ("gpu-p5.48xlarge-16", LONG, {"pipeline": 2, "data": 2, "fsdp": 2, "model": 2}),
        ("gpu-p5.48xlarge-16", MOE, {"pipeline": 4, "fsdp": 2, "expert": 2}),
    ],
)
def test_the_pipelined_floor_is_every_recipes_and_below_its_peak(hardware, model, axes) -> None:
    """`pipeline_memory_floor`, which lets `choose_mesh` drop a pipelined mesh before pricing
    its recipes: one value for every recipe on a layout (its repeats), and none's peak below
    it."""
    p = plan(hardware, **axes)
    r = roles(tuple(p.shape.items()), p.batch_axis_names)
    device = hardware_profile(hardware).facts()
    S = r.size("pipeline")
    floors: dict[int, set[int]] = {}
    for remat, micro, chunks, path, pm, repeats in product(
        ("none", "dots", "full"), (1, 2), (1, 4), ("dropless", "capacity"), (S, 2 * S), (1, 2)
    ):
        train = TrainSpec(global_batch=64, remat=remat, microbatches=micro, logits_chunks=chunks,
                          moe=path, pipeline_microbatches=pm, pipeline_repeats=repeats)  # fmt: skip
        st = stages_of(model, train, r)
        assert st is not None
        terms = pipeline_memory_terms(model, train, r, st, device)
        floor = pipeline_memory_floor(model, train, r, st, device)
        assert floor <= sum(terms[k] for k in phases(terms)[1])
        floors.setdefault(repeats, set()).add(floor)
    assert all(len(found) == 1 for found in floors.values()), floors
