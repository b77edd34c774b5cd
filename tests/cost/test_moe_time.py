"""MoE step-time terms beyond the experts' matmuls (cost/timing/moe.py): the dropping path's
one-hot dispatch and combine einsums counted by hand, the dropless path's row permutes at the
named calibration, and the chooser's expert axis for models with experts."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cost.calibration import permute_bandwidth
from loadax_mesh.cost.choose.mesh import AXES, MOE_AXES
from loadax_mesh.cost.estimate import estimate, estimate_parts, plan_parts
from loadax_mesh.cost.memory.terms import memory_floor
from loadax_mesh.cost.timing.moe import dispatch_einsums, permute_seconds
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.layout import roles
from tests.helpers import weights_floor

# Every dim a whole number of 128-wide tiles: 2 MoE layers of 8 experts, 2 a token.
MOE = ModelSpec(
    name="moe-time", num_layers=2, d_model=1024, d_ff=1024, num_heads=8, num_kv_heads=2,
    head_dim=128, vocab_size=1024, seq_len=1024, num_experts=8, experts_per_token=2,
    moe_d_ff=1024,
)  # fmt: skip
FSDP8 = roles((("fsdp", 8), ("expert", 1)), ("fsdp", "expert"))


def _parts(hardware: str = "tpu-v5p-16"):
    plan = MeshConfig((8, 1), ("fsdp", "expert"), ("fsdp", "expert")).plan(
        simulate_devices(hardware), selector=hardware
    )
    return plan, plan_parts(plan)


def test_dispatch_and_combine_einsums_counted_by_hand():
    train = TrainSpec(global_batch=16, moe="capacity", capacity_factor=1.25, remat="full")
    rate, hbm = 1e14, 1e12
    forward, total = dispatch_einsums(
        MOE, train, FSDP8, rate=rate, hbm=hbm, mxu=(128, 128), recomputed=True
    )
    # 2 sequences a device; C = ceil(1024 x 2 / 8) x 1.25 = 320 slots an expert, 2560 in all;
    # each einsum 2 x S x E C x M FLOPs a sequence (compute-bound at these rates)
    one = 2 * 2.0 * 1024 * 2560 * 1024 / rate
    assert forward == pytest.approx(2 * one)
    # forward 2, backward 1 (dispatch) + 2 (combine), recomputed 2
    assert total == pytest.approx(7 * one)
    dropless = replace(train, moe="dropless")
    assert dispatch_einsums(
        MOE, dropless, FSDP8, rate=rate, hbm=hbm, mxu=(128, 128), recomputed=True
    ) == (0.0, 0.0)


def test_the_einsums_grow_with_the_sequence_at_equal_tokens():
    short, long = (replace(MOE, seq_len=s) for s in (1024, 4096))
    kw = {"rate": 1e14, "hbm": 1e12, "mxu": (128, 128), "recomputed": False}
    a = dispatch_einsums(short, TrainSpec(global_batch=32, moe="capacity"), FSDP8, **kw)[1]
    b = dispatch_einsums(long, TrainSpec(global_batch=8, moe="capacity"), FSDP8, **kw)[1]
    # same tokens a device, capacity per sequence 4x: 4x the work
    assert b == pytest.approx(4 * a)


def test_the_capacity_path_prices_its_einsums_in_the_step():
    plan, parts = _parts()
    train = TrainSpec(global_batch=16, moe="capacity")
    e = estimate(plan, MOE, train)
    rate = e.profile.facts().peak_flops  # an upper bound of the rate: a lower bound of time
    _, einsums = dispatch_einsums(
        MOE, train, parts[0], rate=rate, hbm=math.inf, mxu=(128, 128), recomputed=True
    )
    bigger = estimate(plan, MOE, replace(train, capacity_factor=2.0))
    assert einsums > 0 and e.time.matmul > einsums
    assert bigger.time.matmul > e.time.matmul


def test_the_dropless_permutes_at_the_named_calibration():
    share = permute_bandwidth("tpu")
    assert share is not None and 0 < share < 1
    assert permute_bandwidth("gpu") is None  # no GPU MoE run with a logged step
    train = TrainSpec(global_batch=16)
    seconds = permute_seconds(MOE, train, FSDP8, hbm=1e12, share=0.01, recomputed=True)
    # 2 x 1024 tokens x 2 copies of d_model in bf16, moved 6 times (2 gathers, 2 scatter-adds,
    # 2 gathers again) at 1% of 1 TB/s
    assert seconds == pytest.approx(6 * 2048 * 2 * 1024 * 2 / 1e10)
    assert permute_seconds(MOE, train, FSDP8, hbm=1e12, share=None, recomputed=True) == 0.0
    capacity = replace(train, moe="capacity")
    assert permute_seconds(MOE, capacity, FSDP8, hbm=1e12, share=0.01, recomputed=True) == 0.0
    _, parts = _parts()
    slow, free = (estimate_parts(MOE, train, *parts, permute_share=s) for s in (0.01, math.inf))
    assert slow.time.memory_bound > free.time.memory_bound
    assert slow.step_seconds > free.step_seconds


def test_finer_experts_at_equal_flops_run_slower():
    # issue 1256's pair: 8 experts top-2 against 32 top-8 at a quarter of the width (same total
    # and active parameters but the router's): more copies to move by row
    fine = replace(MOE, num_experts=32, experts_per_token=8, moe_d_ff=256)
    assert fine.num_params == pytest.approx(MOE.num_params, rel=1e-3)
    plan, _ = _parts()
    train = TrainSpec(global_batch=16)
    coarse_e, fine_e = (estimate(plan, m, train) for m in (MOE, fine))
    assert fine_e.model_flops == pytest.approx(coarse_e.model_flops, rel=1e-2)
    assert fine_e.mfu < coarse_e.mfu


def test_choose_mesh_searches_an_expert_axis_for_models_with_experts():
    ranked = choose_mesh("tpu-v5p-16", MOE, TrainSpec(global_batch=16), top=3)
    assert all(tuple(c.plan.shape) == MOE_AXES for c in ranked)
    dense = replace(MOE, num_experts=0, experts_per_token=0, moe_d_ff=0)
    assert all(
        tuple(c.plan.shape) == AXES
        for c in choose_mesh("tpu-v5p-16", dense, TrainSpec(global_batch=16), top=2)
    )


def test_mixtral_8x22b_fits_a_v6e_pod_with_its_recipe_batch():
    model = ModelSpec.from_name("mixtral-8x22b")
    assert model.seq_len == 4096  # MaxText's published recipe, not the 64K context
    best = choose_mesh("tpu-v6e-256", model, TrainSpec(global_batch=2048), top=1)[0]
    assert best.estimate.fits and best.estimate.memory_bytes <= 0.9 * best.estimate.hbm_bytes


def test_a_mesh_whose_weights_alone_overflow_is_skipped_yet_its_need_is_exact():
    # every mesh of 8 v5e chips holds more than 16 GB of LLaMA-3 405B's parameter, gradient
    # and Adam shards: all are skipped before their recipes are priced, and the error still
    # gives the least memory a recipe needs (above that floor: activations and a layer's
    # weights on top)
    model = ModelSpec.from_name("llama3-405b")
    train = TrainSpec(global_batch=8)
    fsdp8 = roles((("data", 1), ("fsdp", 8), ("seq", 1), ("model", 1)), ("data", "fsdp"))
    floor = weights_floor(model, train, fsdp8, hardware_profile("tpu-v5litepod-8").facts())
    with pytest.raises(MeshConfigError, match=r"the smallest needs ([0-9.]+) GB") as err:
        choose_mesh("tpu-v5litepod-8", model, train)
    need = float(re.search(r"needs ([0-9.]+) GB", str(err.value)).group(1)) * 1e9
    assert need > floor


def test_the_floor_is_below_every_recipe_s_memory():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    r, _, _, facts = plan_parts(plan)
    for remat in ("none", "full", "offload"):
        train = TrainSpec(global_batch=16, remat=remat)
        e = estimate(plan, MOE, train)
        assert weights_floor(MOE, train, r, facts) <= e.memory_bytes


def test_the_recipe_free_floor_bounds_every_recipe_and_exceeds_the_weights():
    # memory_floor (the chooser's pruning bound) adds the batch, the reduced gradient shards
    # and the tables to the weights floor: above it, yet below every recipe's peak, micro-batched
    # or not, with a data axis (reduced gradients held) or without
    for preset in ("fsdp", "dp"):
        plan = MeshConfig.from_preset(preset).plan(simulate_devices("tpu-v5p-32"))
        r, _, _, facts = plan_parts(plan)
        for remat, micro in (("none", 1), ("full", 1), ("offload", 1), ("full", 4)):
            train = TrainSpec(global_batch=64, remat=remat, microbatches=micro)
            e = estimate(plan, MOE, train)
            floor = memory_floor(MOE, train, r, facts)
            assert weights_floor(MOE, train, r, facts) < floor <= e.memory_bytes
