"""attention="plain" in the cost model (cost/parts/plain_attention.py): its matmuls over the whole
square and its score-sized memory-bound work, counted by hand. No jax needed."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.parts.plain_attention import plain_attention
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec

LONG = ModelSpec(
    name="long", num_layers=4, d_model=4096, d_ff=16384, num_heads=32, num_kv_heads=8,
    head_dim=128, vocab_size=32768, seq_len=4096,
)  # fmt: skip
H100 = "gpu-p5.48xlarge-16"


def plan(hardware: str):
    return MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)


def both(hardware: str, model: ModelSpec, remat: str):
    """The estimates of one step with the fused kernel and with plain attention."""
    p = plan(hardware)
    return tuple(
        estimate(p, model, TrainSpec(global_batch=64, remat=remat, attention=kind))
        for kind in ("flash", "plain")
    )


def test_plain_attention_counted_by_hand_on_an_h100() -> None:
    """4 rows a GPU, 32 heads, 4096 x 4096 scores a head, full remat: 8 matmuls a layer over
    the whole square (forward 2, again 2, backward 4), each bound by the bf16 score tensor it
    writes or reads; the softmax 13 score-sized bf16 accesses a layer (forward 4, again 4,
    backward 5), at the H100's measured share of its HBM bandwidth; the FLOPs of the whole
    square, the model's own FLOPs unchanged."""
    flash, plain = both(H100, LONG, "full")
    facts = hardware_profile(H100).facts()
    hbm, share = facts.hbm_bandwidth, facts.memory_share
    assert (hbm, share, facts.matmul_share) == (3350e9, 0.49, 0.69)
    squares = 4 * 32 * 4096 * 4096  # of a layer on a GPU
    tokens = 4 * 4096
    head_sized = tokens * (4096 + 1024 + (8 + 32) * 128) * 2 / 2  # two of q, k, v and output
    matmul = max(squares * 2 * 128 / (989e12 * 0.69), (squares * 2 + head_sized) / hbm)
    assert plain.time.attention == pytest.approx(4 * 8 * matmul)
    softmax = 4 * squares * 13 * 2 / (hbm * share)
    assert plain.time.memory_bound - flash.time.memory_bound == pytest.approx(softmax)
    assert plain.time.matmul == flash.time.matmul
    whole, causal = 4 * 4096 * 32 * 128, 2 * 4096 * 32 * 128  # FLOPs per token, forward
    assert plain.flops - flash.flops == pytest.approx(4 * tokens * 4 * (whole - causal))
    assert plain.model_flops == flash.model_flops
    assert plain.step_seconds > flash.step_seconds


@pytest.mark.parametrize(
    ("remat", "qk", "pv"),
    [("full", 1, 1), ("dots_attention", 1, 0), ("dots", 1, 1), ("none", 0, 0)],
)
def test_what_the_backward_pass_runs_again(remat: str, qk: int, pv: int) -> None:
    """The backward pass reads the probabilities, which no named tensor keeps: under every
    checkpoint q.k^T and the softmax run again, weights.v only where the attention's output
    is recomputed (not under dots_attention, which keeps it); with no checkpoint nothing runs
    again and the softmax's gradient reads the float32 probabilities autodiff saved."""
    train = TrainSpec(global_batch=64, remat=remat, attention="plain")
    passes = plain_attention(LONG, train)
    assert [f for f, _ in passes.again.matmuls] == [2.0 * 128] * (qk + pv)
    assert passes.forward.elementwise == 4 * 2  # bf16: the softmax's 3 reads and its write
    assert passes.again.elementwise == (4 * 2 if qk else 0)
    assert passes.backward.elementwise == (5 * 2 if qk else 3 * 2 + 2 * 4)
    flash, plain = both("tpu-v5p-16", LONG, remat)
    # 8 rows a chip; FLOPs a token of one matmul over the whole square, which the fused
    # kernel's forward (both matmuls over the causal half) also does
    tokens, per_matmul = 8 * 4096, 2 * 4096 * 32 * 128
    fused = per_matmul if qk else 0
    expected = 4 * tokens * ((qk + pv) * per_matmul - fused)
    assert plain.recompute_flops - flash.recompute_flops == pytest.approx(expected)


def test_the_difference_grows_as_the_square_of_the_sequence() -> None:
    """At the same batch, doubling the sequence doubles the tokens but quadruples the scores:
    what plain attention costs beyond the fused kernel grows about 4 times (the head-sized
    operands each matmul also reads grow as the tokens)."""
    gaps, steps = [], []
    for seq in (1024, 2048, 4096):
        flash, plain = both("tpu-v5p-16", replace(LONG, seq_len=seq), "full")
        assert plain.step_seconds > flash.step_seconds
        gaps.append(plain.step_seconds - flash.step_seconds)
        steps.append(flash.step_seconds)
    for shorter, longer in pairwise(gaps):
        assert longer / shorter == pytest.approx(4, rel=0.05)
    assert steps[2] / steps[1] < 3  # the fused step grows less than the square
