"""The recipe in the cost model: placements, micro-batches, logits chunks, host memory and the
offload link, and choose_mesh searching recipes with meshes. No jax needed."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.choose.recipes import LOGITS_CHUNKS, MAXTEXT_OFFLOAD, REMATS
from loadax_mesh.cost.parts.flops import op_flops
from loadax_mesh.workload import ModelSpec, TrainSpec

# Every dim a whole number of TPU tiles, as in test_cost.
SMALL = ModelSpec(
    name="small", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=2,
    head_dim=128, vocab_size=1024, seq_len=128,
)  # fmt: skip
L, D, F, V, S, CD = 2, 1024, 1024, 1024, 128, 2


def small(hardware="tpu-v5p-16", batch=8, **recipe):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware))
    return estimate(plan, SMALL, TrainSpec(global_batch=batch, **recipe))


def test_offloaded_tensors_move_from_device_to_host():
    full, off = small(), small(remat="offload")
    tokens = S  # one sequence per device
    assert full.host_bytes == 0 and full.terms["activations"] == L * tokens * D * CD
    # "offload": the layer input goes to host memory instead of HBM
    assert off.terms["activations"] == 0 and off.host_bytes == L * tokens * D * CD
    assert off.terms["layer"] == full.terms["layer"]  # the same recompute as "full"
    custom = small(remat={"layer_input": "offload", "query": "offload", "key": "device"})
    q, k = tokens * 8 * 128 * CD, tokens * 2 * 128 * CD
    assert custom.host_bytes == L * (tokens * D * CD + q)
    assert custom.terms["activations"] == L * k
    assert custom.remat == "layer_input=offload,query=offload,key=device"
    assert custom.fits and custom.host_memory_bytes == int(448e9 / 4)  # a v5p VM's RAM / 4


def test_a_custom_placement_holds_what_it_recomputes():
    dots = small(remat="dots")
    # dots' placement (the attention output recomputed) with the MLP's output recomputed too
    saved = {t: "device" for t in MAXTEXT_OFFLOAD} | {"mlp_in": "device"}
    custom = small(remat=saved)
    attention = S * 8 * 128 * CD  # recomputed, so live again
    # The MLP's output is neither saved nor recomputed: no backward pass reads it.
    assert custom.terms["layer"] == dots.terms["layer"] + attention
    assert custom.terms["activations"] == dots.terms["activations"]


def test_no_remat_saves_what_autodiff_keeps_not_the_named_tensors():
    """Under "none" a layer keeps each operation's residuals: per norm its float32 input and
    normalised value and its output; attention's operands, splash's result in the kernel's
    layout and in the model's, its log-sum-exp; six d_ff-wide SwiGLU tensors. Not the layer
    input, the projections before the rotary embedding, or the outputs that feed only adds."""
    none = small(remat="none")
    q, kv = S * 8 * 128 * CD, S * 2 * 128 * CD
    per_layer = 4 * S * D * 4 + 2 * S * D * CD + 3 * q + 2 * kv + 8 * S * 4 + 6 * S * F * CD
    assert none.terms["activations"] == L * per_layer
    assert none.host_bytes == 0
    # with the sequence split, keys and values are kept gathered along it
    sp = estimate(
        MeshConfig(
            mesh_shape=(4, 2), mesh_axis_names=("fsdp", "seq"), batch_axis_names=("fsdp",)
        ).plan(simulate_devices("tpu-v5p-16")),
        SMALL,
        TrainSpec(global_batch=4, remat="none"),
    )
    half, lanes = S // 2, 128  # the log-sum-exp's 64 positions padded to a tile's 128 lanes
    per_layer = (
        4 * half * D * 4 + 2 * half * D * CD + 3 * q // 2 + 2 * kv + 8 * lanes * 4
        + 6 * half * F * CD
    )  # fmt: skip
    assert sp.terms["activations"] == L * per_layer


def test_microbatches_divide_the_per_row_terms_and_add_an_accumulator():
    one, two = small(batch=16), small(batch=16, microbatches=2)
    assert one.terms["accumulator"] == 0
    assert two.terms["accumulator"] == one.terms["gradients"]  # float32 params: same size
    assert two.terms["activations"] * 2 == one.terms["activations"]
    assert two.terms["logits"] * 2 == one.terms["logits"]
    assert two.terms["batch"] == one.terms["batch"]  # the step's batch is an argument, whole
    assert two.microbatches == 2 and two.flops == one.flops
    # every collective once per micro-batch: the weights gathered again
    kinds = {c.what: c.count for c in two.axes["fsdp"].collectives}
    assert kinds["attention weights"] == kinds["MLP weights"] == 2 * 2 * L
    assert kinds["layer weight gradients"] == 2 * L
    assert two.axes["fsdp"].bytes == 2 * one.axes["fsdp"].bytes


def test_logits_chunks_divide_the_logits_and_recompute_the_head():
    one, four = small(), small(logits_chunks=4)
    assert four.terms["logits"] * 4 == one.terms["logits"] and four.logits_chunks == 4
    head = S * 2 * V * D  # each chunk's logits recomputed in the backward pass
    assert four.recompute_flops == one.recompute_flops + head
    # the unembedding gathered in every chunk, forward and recompute, its gradient per chunk
    kinds = {c.what: (c.bytes, c.count) for c in four.axes["fsdp"].collectives}
    assert kinds["unembedding per chunk"] == (V * D * CD, 2 * 4 - 1)
    assert kinds["unembedding gradient per chunk"] == (V * D * CD, 4 - 1)
    assert four.axes["fsdp"].bytes == one.axes["fsdp"].bytes + 10 * V * D * CD


def test_tensor_parallel_traffic_follows_the_hidden_cut_stream():
    """Per layer under full remat: 10 activation gathers (forward 2, recompute 2, backward 6:
    each matmul gathers what it needs whole) and 5 reduce-scatters; without a recompute 8 and
    4. Logits chunks change none of it. On TPU libtpu overlaps the backward pass's gathers but
    the one that regathers a norm's output, and one reduce-scatter a pass (a tensor-16 step's
    scheduled HLO: full 4 gathers and 3 reductions wait a layer, dots 3 and 2); on GPU all
    wait."""

    def tensor(hardware="tpu-v5p-16", **recipe):
        plan = MeshConfig.from_preset("fsdp_tp", tp=2).plan(simulate_devices(hardware))
        e = estimate(plan, SMALL, TrainSpec(global_batch=8, **recipe))
        return {c.what: (c.kind, c.count, c.overlaps) for c in e.axes["model"].collectives}

    full = tensor(remat="full")
    assert full["hidden-cut activations"] == ("all-gather", 4 * L + 3, False)
    assert full["backward gathers beside matmuls"] == ("all-gather", 6 * L, True)
    assert full["block outputs and gradients"] == ("reduce-scatter", 3 * L + 1, False)
    assert full["windowed-matmul reductions"] == ("reduce-scatter", 2 * L, True)
    dots = tensor(remat="dots")
    assert dots["hidden-cut activations"][1] + dots["backward gathers beside matmuls"][1] == (
        8 * L + 3
    )
    assert (dots["hidden-cut activations"][1], dots["block outputs and gradients"][1]) == (
        3 * L + 3,
        2 * L + 1,
    )
    assert tensor(remat="full", logits_chunks=4) == full
    gpu = tensor("gpu-a3-highgpu-8g-16", remat="full")
    assert gpu["hidden-cut activations"] == ("all-gather", 10 * L + 3, False)
    assert gpu["block outputs and gradients"] == ("reduce-scatter", 5 * L + 1, False)
    assert "windowed-matmul reductions" not in gpu


def test_recompute_flops_follow_the_placement():
    ops = op_flops(SMALL)
    assert sum(ops.values()) == 2 * (SMALL.layer_params - 2 * D) + 2 * S * 8 * 128
    assert small(remat="none").recompute_flops == 0
    # full: every op but the down projection's (nothing in the backward pass reads its output)
    assert small(remat="full").recompute_flops == S * L * (sum(ops.values()) - ops["mlp_out"])
    assert small(remat="dots").recompute_flops == S * L * ops["attention_out"]
    custom = small(remat={"query": "device", "mlp_in": "offload"})
    again = sum(v for t, v in ops.items() if t not in ("layer_input", "query", "mlp_in", "mlp_out"))
    assert custom.recompute_flops == S * L * again
    assert custom.flops == small(remat="none").flops + custom.recompute_flops


def test_offload_transfers_hide_behind_their_pass_on_tpu_and_wait_on_gpu():
    e = small(remat="offload", batch=8)
    assert e.offload_bytes == e.host_bytes
    assert e.offload_seconds == pytest.approx(e.host_bytes / 15e9)  # v5p's host link
    forward = e.time.forward
    backward = e.compute_seconds - forward
    want = max(0.0, e.offload_seconds - forward) + max(0.0, e.offload_seconds - backward)
    assert e.offload_exposed_seconds == pytest.approx(want, abs=1e-9)
    hidden = max(a.seconds - a.exposed_seconds for a in e.axes.values())
    assert e.step_seconds == pytest.approx(
        max(e.compute_seconds, hidden) + e.time.exposed + e.offload_exposed_seconds
    )
    # A tiny step's transfers outlast its compute: exposed.
    assert e.offload_exposed_seconds > 0
    # On GPU both directions wait whole (measured on an H200:
    # docs/notes/2026-11-25-h200-real-step.md).
    g = small("gpu-p5.48xlarge-8", remat="offload")
    assert g.offload_seconds == pytest.approx(g.host_bytes / 64e9)  # PCIe Gen5 x16, each way
    assert g.offload_exposed_seconds == pytest.approx(2 * g.offload_seconds)
    t = g.time
    assert t.seconds == pytest.approx(max(t.compute, t.hidden) + t.exposed + 2 * g.offload_seconds)


def test_host_memory_judges_fit_and_missing_facts_are_named():
    # 70B on a v5e-256 offloading its layer inputs: 48 GB of host memory a chip holds them
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5litepod-256"))
    e = estimate(plan, ModelSpec.from_name("llama3-70b"), TrainSpec(global_batch=2048,
                                                                    remat="offload"))  # fmt: skip
    assert e.host_bytes > e.host_memory_bytes and not e.fits and e.verdict == "does not fit"
    # v4's catalogue entry has no host memory: an offload's estimate says what a host must hold
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v4-32"))
    v4 = estimate(plan, SMALL, TrainSpec(global_batch=16, remat="offload"))
    [condition] = v4.assumes
    assert condition.startswith("the offloaded activations fit if a host holds >= ")
    assert f"{v4.host_bytes / 1e9:.2f} GB a chip" in condition  # one megacore device a chip
    assert estimate(plan, SMALL, TrainSpec(global_batch=16)).host_memory_bytes is None
    # a GB200 rack has no host link: GPU copies wait, so no condition answers and offloads are
    # not searched there
    ranking = choose_mesh("gpu-a4x-highgpu-4g-72", "tiny", TrainSpec(global_batch=72), top=1)
    assert "offload" not in ranking[0].train.placements.values()
    # and the ranking says so, naming what is missing; TPU7x's are searched on its condition
    assert ranking.unsearched == [
        "recipes that offload to host memory (the catalogue has no host link bandwidth for "
        "gpu-a4x-highgpu-4g-72; --fact sets it)"
    ]
    ironwood = choose_mesh("tpu-7x-8", "tiny", TrainSpec(global_batch=8), top=1)
    assert ironwood.unsearched == [] and "host link bandwidth" in ironwood.assumed[0]
    assert choose_mesh("tpu-v5p-8", "tiny", TrainSpec(global_batch=8), top=1).unsearched == []


def test_to_dict_carries_the_recipe():
    data = small(batch=16, remat="offload", microbatches=2, logits_chunks=4).to_dict()
    assert (data["remat"], data["microbatches"], data["logits_chunks"]) == ("offload", 2, 4)
    assert data["host_bytes"] > 0 and data["offload_exposed_seconds"] >= 0


def test_choose_finds_a_recipe_where_the_plain_step_fits_nowhere():
    model, train = ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=512)
    plain = [{"remat": "full", "microbatches": 1, "logits_chunks": 1}]
    with pytest.raises(MeshConfigError, match=r"fits no mesh .* with any recipe searched"):
        choose_mesh("tpu-v5litepod-128", model, train, recipes=plain)
    ranking = choose_mesh("tpu-v5litepod-128", model, train)
    best = ranking[0]
    assert best.estimate.fits and best.train.global_batch == 512
    assert (best.train.microbatches, best.train.logits_chunks) != (1, 1) or (
        best.train.remat != "full"
    )
    assert best.estimate.remat == best.train.remat_text
    assert best.estimate.microbatches == best.train.microbatches
    keys = [(c.estimate.step_seconds, sum(a.seconds for a in c.estimate.axes.values()))
            for c in ranking]  # fmt: skip
    assert keys == sorted(keys)


def test_the_search_keeps_the_fewest_microbatches_that_fit():
    model = ModelSpec.from_name("llama3-8b")
    ranking = choose_mesh(
        "tpu-v5litepod-256", model, TrainSpec(global_batch=512), recipes=[{"remat": "full"}]
    )
    for c in ranking:
        t = c.train
        assert t.remat == "full" and t.logits_chunks in LOGITS_CHUNKS
        if t.microbatches > 1:  # one fewer micro-batch would not fit
            rows = 512 // (c.estimate.mesh["data"] * c.estimate.mesh["fsdp"])
            fewer = max(m for m in range(1, t.microbatches) if rows % m == 0)
            again = estimate(c.plan, model, TrainSpec(global_batch=512, remat="full",
                                                      microbatches=fewer,
                                                      logits_chunks=t.logits_chunks))  # fmt: skip
            assert again.memory_bytes > 0.9 * again.hbm_bytes


def test_recipes_narrow_the_search():
    train = TrainSpec(global_batch=16)
    one = [{"remat": "dots", "microbatches": 2, "logits_chunks": 4}]
    for c in choose_mesh("tpu-v5p-16", "tiny", train, recipes=one):
        assert (c.train.remat, c.train.microbatches, c.train.logits_chunks) == ("dots", 2, 4)
    remats = {c.train.remat_text for c in choose_mesh("tpu-v5p-16", "tiny", train, top=50)}
    assert remats <= {TrainSpec(global_batch=1, remat=r).remat_text for r in REMATS}
    auto = MeshConfig.from_preset(
        "auto", hardware="tpu-v5p-16", model="tiny", global_batch=16, remat="dots"
    )
    dots = choose_mesh("tpu-v5p-16", "tiny", train, recipes=[{"remat": "dots"}])
    assert auto.mesh_shape == dots[0].config.mesh_shape and dots[0].train.remat == "dots"


@pytest.mark.parametrize(
    ("recipes", "message"),
    [
        ("full", "recipes='full'; accepted: an iterable of mappings"),
        ({"remat": "full"}, "accepted: an iterable of mappings"),
        (5, "recipes=5; accepted"),
        ([], r"recipes=\[\] holds no recipe"),
        (["full"], "recipes: 'full' is no mapping"),
        ([{"global_batch": 8}], "recipes: unknown field 'global_batch'"),
        ([{"remat": "most"}], "remat='most'; accepted: full, dots, dots_attention, none, offload"),
        ([{"microbatches": 0}], "microbatches=0; accepted: a positive integer"),
        ([{"logits_chunks": 2.0}], "logits_chunks=2.0; accepted: a positive integer"),
    ],
)
def test_bad_recipes(recipes, message):
    with pytest.raises(MeshConfigError, match=message):
        choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16), recipes=recipes)
