"""The cost model: a small case counted by hand, choosing, and bad input. No jax needed."""

from __future__ import annotations

import pytest

from loadax_mesh import (
    HybridMeshShape,
    MeshConfig,
    MeshConfigError,
    choose_mesh,
    simulate_devices,
)
from loadax_mesh.cost import estimate
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec

# Every dim a whole number of TPU tiles (minor dims multiples of 128), so no padding.
SMALL = ModelSpec(
    name="small", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=2,
    head_dim=128, vocab_size=1024, seq_len=128,
)  # fmt: skip
TPU, GPU = (hardware_profile(h).facts() for h in ("tpu-v5p-16", "gpu-p5.48xlarge-8"))


def small_estimate(remat="full"):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    assert plan.shape == {"data": 1, "fsdp": 8}
    return estimate(plan, SMALL, TrainSpec(global_batch=8, remat=remat))


def test_memory_counted_by_hand():
    e = small_estimate()
    L, D, F, V, S, cd = 2, 1024, 1024, 1024, 128, 2
    qkvo = D * 128 * (2 * 8 + 2 * 2)
    layer_weights = qkvo + 3 * D * F  # one layer, norms aside
    sharded = 2 * V * D + L * layer_weights  # every weight shards its d_model over fsdp=8
    replicated = 2 * L * D + D  # the norms
    per_device = sharded // 8 + replicated
    tokens = 1 * S  # one sequence per device
    assert e.terms["params"] == 4 * per_device
    assert e.terms["optimizer"] == 2 * 4 * per_device
    assert e.terms["gradients"] == 4 * per_device
    assert e.terms["batch"] == 2 * 4 * tokens
    assert e.terms["activations"] == L * tokens * D * cd  # full remat: each layer's input
    assert e.terms["logits"] == 2 * tokens * V * cd  # and their gradient
    assert e.terms["embeddings"] == 2 * V * D * cd  # a gathered table and its gradient
    # Full remat on TPU, one sublayer at a time. The MLP's backward: its weights gathered and
    # their gradient, the attention's output projection gathered ahead (q, k and v are
    # gathered again for their input gradient); gate and up recomputed and their gradients
    # (4 d_ff-wide per token); the attention's residuals: rotated q and its output (8 heads),
    # rotated k and v (2), the splash kernel's float32 log-sum-exp written over 128 lanes; the
    # layer's input and the gradient flowing back. The attention's backward (the larger here):
    # its weights and their gradient, the MLP's gathered ahead, its residuals and theirs.
    residuals = tokens * (8 + 8 + 2 + 2) * 128 * cd + 8 * tokens * 128 * 4
    wo = D * 8 * 128
    mlp = 2 * 3 * D * F * cd + wo * cd + 4 * tokens * F * cd + residuals + 2 * tokens * D * cd
    attention = 2 * qkvo * cd + 3 * D * F * cd + 2 * residuals + 2 * tokens * D * cd
    assert attention > mlp
    assert e.terms["layer"] == attention
    always = e.terms["params"] + e.terms["optimizer"] + e.terms["batch"]
    loop = always + e.terms["activations"] + e.terms["gradients"] + e.terms["layer"]
    assert e.phases["layer loop"] == loop == e.memory_bytes == sum(e.memory.values())
    assert e.memory["logits"] == 0  # not live in the layer loop
    assert e.fits and e.hbm_bytes == int(95.74 * 2**30)


def test_tables_wait_across_slices_only_where_parameters_are_replicated_there():
    """A data axis over two slices holds both tables and both gradients for the reduction
    across slices at the end of the step (the input table's gradient exists only after the
    backward layer loop, so the head of the backward pass holds one table and its gradient);
    an FSDP axis over both reduces them in one collective as soon as each is computed
    (libtpu on 2 x v6e-256), so it holds what one slice does."""
    devices = simulate_devices("tpu-v5p-16-2")
    V, D, cd = 1024, 1024, 2
    train = TrainSpec(global_batch=16)

    def tables(config: MeshConfig) -> int:
        e = estimate(config.plan(devices), SMALL, train)
        t = e.terms  # the held tables are in the tail, not in the backward pass's head
        head_less_tail = t["activations"] + t["logits"] - t["reduced gradients"] - t["held tables"]
        assert e.phases["backward head"] - e.phases["tail"] == head_less_tail
        return e.terms["embeddings"] + e.terms["held tables"]

    def config(dcn: tuple[int, int]) -> MeshConfig:
        shape = HybridMeshShape((1, 8), dcn)
        return MeshConfig(
            mesh_shape=shape, mesh_axis_names=("data", "fsdp"), batch_axis_names=("data", "fsdp")
        )

    data, fsdp = config((2, 1)), config((1, 2))
    assert tables(data) == 4 * V * D * cd
    assert tables(fsdp) == 2 * V * D * cd


def test_collectives_and_compute_counted_by_hand():
    e = small_estimate()
    L, D, F, V, S, cd = 2, 1024, 1024, 1024, 128, 2
    attention = D * 128 * (2 * 8 + 2 * 2) * cd  # q, k, v and output gathered in bf16
    layer = attention + 3 * D * F * cd  # one layer
    tables = 2 * V * D * cd
    fsdp = e.axes["fsdp"]
    qkv = D * 128 * (8 + 2 + 2) * cd
    kinds = {(c.kind, c.what): (c.bytes, c.count) for c in fsdp.collectives}
    hidden = {c.what for c in fsdp.collectives if c.overlaps}
    assert kinds == {  # forward and backward; on TPU the attention block's in line, and its
        # q, k and v gathered again for their input gradient
        ("all-gather", "attention weights"): (attention, 2 * L),
        ("all-gather", "q, k, v weights again"): (qkv, L),
        ("all-gather", "MLP weights"): (layer - attention, 2 * L),
        ("reduce-scatter", "layer weight gradients"): (layer, L),
        ("all-gather", "embedding tables"): (tables, 1),
        ("reduce-scatter", "embedding gradients"): (tables, 1),
    }
    assert hidden == {"MLP weights", "layer weight gradients", "embedding tables",
                      "embedding gradients"}  # fmt: skip
    assert fsdp.bytes == 3 * L * layer + L * qkv + 2 * tables and fsdp.across_granules == 0
    assert e.axes["data"].bytes == 0
    # 2 FLOPs per weight per token, causal attention, 3x for the backward pass, and full
    # remat's second forward pass of the layers but their down projections (the backward
    # pass reads no output of theirs).
    per_layer = 2 * (D * 128 * (2 * 8 + 2 * 2) + 3 * D * F) + 2 * S * 8 * 128
    forward = S * (L * per_layer + 2 * V * D)
    assert e.flops == 3 * forward + S * L * (per_layer - 2 * F * D)
    t = e.time  # the terms themselves: tests/cost/test_time.py
    assert e.compute_seconds == pytest.approx(t.matmul + t.attention + t.memory_bound)
    assert e.compute_seconds > e.flops / 459e12  # below the peak
    hidden, exposed = fsdp.seconds - fsdp.exposed_seconds, fsdp.exposed_seconds
    assert exposed > 0 and t.exposed == pytest.approx(exposed)  # the attention gathers wait
    assert e.step_seconds == pytest.approx(max(e.compute_seconds, hidden) + exposed)


def test_attention_gathers_wait_on_tpu_alone():
    """libtpu gathers a layer's attention weights in line (the compiled schedules of
    docs/notes/2026-11-26-gpt3-llama2-v6e-schedules.md); on GPU the layer's weights are
    gathered whole, beside the compute."""
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5.48xlarge-8"))
    gpu = estimate(plan, SMALL, TrainSpec(global_batch=8))
    hides = {c.what: c.overlaps for c in gpu.axes["fsdp"].collectives}
    assert hides["layer weights"] and "attention weights" not in hides
    assert gpu.time.exposed == 0


def test_only_tpu_splash_attention_holds_the_kernels_buffers():
    """The splash kernel's lane-wide log-sum-exp and accumulators are TPU-only; elsewhere the
    log-sum-exp is one float32 per head and token."""
    from loadax_mesh.cost.memory.terms import memory_terms
    from loadax_mesh.workload.layout import roles

    r = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    train = TrainSpec(global_batch=8, remat="dots")
    tpu, gpu = (memory_terms(SMALL, train, r, device)["layer"] for device in (TPU, GPU))
    kernel = 8 * 128 * 128 * 4 + 6 * 128 * 128 * 4  # lane-wide log-sum-exp, accumulators
    assert tpu - gpu == kernel - 8 * 128 * 4  # "dots": the gradients of the intermediates


def test_only_tpu_holds_a_compute_dtype_set_of_data_parallel_gradients():
    """TPU reduces the gradient shards over data after the layer loop, from a stacked bf16
    set; XLA's GPU pipeline reduces each layer's inside the loop, so data parallelism adds no
    memory there (a GPU compile of LLaMA-2 7B, 4 layers: data 2 x fsdp 8 needs no more than
    fsdp 8)."""
    from loadax_mesh.cost.memory.terms import memory_terms
    from loadax_mesh.workload.layout import roles

    train = TrainSpec(global_batch=16)
    dp = roles([("data", 2), ("fsdp", 8)], ["data", "fsdp"])
    alone = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    tpu = memory_terms(SMALL, train, dp, TPU)
    assert tpu["reduced gradients"] == tpu["gradients"] // 2  # float32 shards, once in bf16
    assert memory_terms(SMALL, train, alone, TPU)["reduced gradients"] == 0
    assert memory_terms(SMALL, train, dp, GPU)["reduced gradients"] == 0


def test_remat_policies_order_the_memory():
    full, dots, none = (small_estimate(r).terms["activations"] for r in ("full", "dots", "none"))
    assert full < dots < none


def test_the_winner_fits_and_is_fastest():
    ranking = choose_mesh(
        "tpu-v5p-128", ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=64)
    )
    assert 1 <= len(ranking) <= 5 and ranking.planned >= len(ranking)
    assert ranking.considered > sum(ranking.pruned.values())
    steps = [c.estimate.step_seconds for c in ranking]
    assert steps == sorted(steps)
    for c in ranking:
        assert c.estimate.fits and c.estimate.memory_bytes <= 0.9 * c.estimate.hbm_bytes
        assert isinstance(c.config, MeshConfig)
        assert c.plan.shape == c.estimate.mesh
    auto = MeshConfig.from_preset(
        "auto", hardware="tpu-v5p-128", model="llama3-8b", global_batch=64
    )
    assert auto == ranking[0].config


def test_a_model_that_fits_nowhere():
    with pytest.raises(MeshConfigError, match=r"needs \d+\.\d+ GB per device, the hardware has"):
        choose_mesh("tpu-v5litepod-8", ModelSpec.from_name("llama3-70b"), TrainSpec(global_batch=8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"axes": ("data", "experts")}, "axes=\\('data', 'experts'\\)"),
        ({"axes": ("model", "seq")}, "has no batch axis"),
        ({"top": 0}, "top=0"),
        ({"headroom": 1.5}, "headroom=1.5"),
        ({"axes": 5}, "axes=5"),
        ({"axes": [["data"]]}, "axes=\\[\\['data'\\]\\]"),
    ],
)
def test_bad_choose_input(kwargs, message):
    with pytest.raises(MeshConfigError, match=message):
        choose_mesh("tpu-v5p-16", SMALL, TrainSpec(global_batch=8), **kwargs)


def test_a_batch_smaller_than_every_data_parallel_degree():
    with pytest.raises(MeshConfigError, match="global_batch=1 is smaller than"):
        choose_mesh("tpu-v5p-16", SMALL, TrainSpec(global_batch=1), axes=("data", "fsdp"))


def test_a_model_is_given_by_name_or_shape():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    train = TrainSpec(global_batch=8)
    assert estimate(plan, "tiny", train) == estimate(plan, ModelSpec.from_name("tiny"), train)
    with pytest.raises(MeshConfigError, match="llama-nine"):
        estimate(plan, "llama-nine", train)


def test_missing_catalogue_facts_are_named():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v2-32"))
    with pytest.raises(MeshConfigError, match="the catalogue has no ici_link_bandwidth for it"):
        estimate(plan, SMALL, TrainSpec(global_batch=32))
    with pytest.raises(MeshConfigError, match="preset 'auto' needs hardware="):
        MeshConfig.from_preset("auto", model="tiny")


def test_choose_mesh_takes_a_model_name_and_auto_names_unknown_options():
    by_name = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16))
    by_spec = choose_mesh("tpu-v5p-16", ModelSpec.from_name("tiny"), TrainSpec(global_batch=16))
    assert [c.estimate.mesh for c in by_name] == [c.estimate.mesh for c in by_spec]
    with pytest.raises(MeshConfigError, match=r"unknown option tp=2; accepted: .*remat"):
        MeshConfig.from_preset("auto", hardware="tpu-v5p-16", model="tiny", global_batch=16, tp=2)
    auto = MeshConfig.from_preset(
        "auto", hardware="tpu-v5p-16", model="tiny", global_batch=16, remat="dots"
    )
    dots = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16, remat="dots"))
    assert auto.mesh_shape == dots[0].config.mesh_shape


def test_full_remat_on_tpu_holds_one_sublayer_at_a_time():
    """libtpu's live buffers at the peak: a recomputed layer's backward holds one sublayer's
    weights and gradients at a time, and of a two-matrix ReLU MLP only the gradient of its
    input projection (the sign rides the fused gradient); over a tensor axis also the
    sublayer's input gathered whole. GPU keeps the whole-layer count (factor 2)."""
    from dataclasses import replace

    from loadax_mesh.cost.memory.terms import memory_terms
    from loadax_mesh.workload.layout import roles

    r = roles([("data", 1), ("fsdp", 8)], ["data", "fsdp"])
    train = TrainSpec(global_batch=8)
    D, F, S, cd = 1024, 1024, 128, 2
    relu = memory_terms(replace(SMALL, mlp="relu"), train, r, TPU)
    qkvo = D * 128 * (2 * 8 + 2 * 2) * cd
    residuals = S * (8 + 8 + 2 + 2) * 128 * cd + 8 * S * 128 * 4  # as counted above
    stream = 2 * S * D * cd
    # ReLU: two matrices; its MLP phase holds the up projection's gradient alone, and here the
    # attention phase (its weights twice, the MLP's once, the residuals and their gradients)
    # is the larger.
    mlp = 2 * 2 * D * F * cd + qkvo + S * F * cd + residuals + stream
    attention = 2 * qkvo + 2 * D * F * cd + 2 * residuals + stream
    assert attention > mlp and relu["layer"] == attention
    # SwiGLU twice as wide: its MLP phase, with gate and up and their gradients, is the
    # larger. It holds the attention's output projection gathered ahead; q, k and v are
    # gathered again for their input gradient (`layout.regathered`), where gathered at all.
    wide, F2 = replace(SMALL, d_ff=2 * F), 2 * F
    wo = D * 8 * 128 * cd
    mlp = 2 * 3 * D * F2 * cd + wo + 4 * S * F2 * cd + residuals + stream
    assert memory_terms(wide, train, r, TPU)["layer"] == mlp
    whole = roles([("data", 8), ("fsdp", 1)], ["data", "fsdp"])  # nothing gathered
    assert memory_terms(wide, train, whole, TPU)["layer"] == mlp - wo + qkvo
    # Over a tensor axis (fsdp 4 x tensor 2: two rows a device): weights, heads, d_ff and the
    # residual stream halved, and the MLP's normalised input gathered whole beside them.
    tensor = roles([("fsdp", 4), ("model", 2)], ["fsdp"])
    T = 2 * S
    residuals = T * (4 + 4 + 1 + 1) * 128 * cd + 4 * T * 128 * 4
    stream, gathered = 2 * T * (D // 2) * cd, T * D * cd
    mlp = 3 * D * F2 * cd + wo // 2 + 4 * T * (F2 // 2) * cd + residuals + stream + gathered
    assert memory_terms(wide, train, tensor, TPU)["layer"] == mlp


def test_a_memory_term_declared_in_no_phase_is_refused() -> None:
    """Every term is declared once with the phases it is live in (memory/terms.py TERMS); one
    that is not is an error, never silently left out of the peak."""
    from loadax_mesh.cost.memory.terms import TERMS, phases

    totals, live = phases({"params": 3, "logits": 5, "layer": 7})
    assert totals == {"backward head": 8, "layer loop": 10, "tail": 3}
    assert live == {"params", "layer"}
    assert all(set(where) <= set(totals) for where in TERMS.values())
    with pytest.raises(LookupError, match="'made up'"):
        phases({"params": 1, "made up": 2})
