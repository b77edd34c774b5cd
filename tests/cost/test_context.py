"""Long context in the cost model: the pairs a causal or windowed mask keeps per sequence shard,
the load balance, the sequence axis sharding the weights, and each context strategy's traffic
(docs/design.md section 14). No jax."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cost import estimate
from loadax_mesh.cost.parts.context import imbalance, prefix_pairs, shard_pairs, window_share
from loadax_mesh.view.estimate import ranking_text
from loadax_mesh.workload import ModelSpec, TrainSpec

H100 = "gpu-p5.48xlarge-8"


def _plan(shape: tuple[int, int]):
    config = MeshConfig(shape, ("fsdp", "seq"), ("fsdp",))
    return config.plan(simulate_devices(H100), selector=H100)


def _llama(seq_len: int, **fields) -> ModelSpec:
    return replace(ModelSpec.from_name("llama3-8b"), seq_len=seq_len, **fields)


def test_pairs_count_what_the_mask_keeps() -> None:
    # by brute force over positions
    for n, w in ((10, 0), (10, 3), (10, 10), (10, 12)):
        kept = sum(1 for q in range(n) for k in range(n) if k <= q and (not w or q - k < w))
        assert prefix_pairs(n, w) == kept


@pytest.mark.parametrize("shards", [2, 4, 8])
@pytest.mark.parametrize("window", [0, 100])
def test_shards_split_the_pairs_and_the_balance_evens_causal_work(shards, window) -> None:
    n = 1600
    for balanced in (True, False):
        assert sum(shard_pairs(n, shards, window, balanced=balanced)) == prefix_pairs(n, window)
    balanced = shard_pairs(n, shards, 0, balanced=True)
    assert max(balanced) == min(balanced)  # chunks i and 2c - 1 - i: even causal work
    model = _llama(n * 64)
    # contiguous causal shards: the last does (2c - 1) / c of the mean (frontier.md 1.5; the
    # diagonal adds O(1 / seq))
    assert imbalance(model, shards, balanced=False) == pytest.approx(
        (2 * shards - 1) / shards, rel=1e-4
    )
    assert imbalance(model, shards, balanced=True) == pytest.approx(1.0)


def test_local_layers_cost_less_than_global_ones() -> None:
    train = TrainSpec(global_batch=8, remat="full")
    dense = _llama(32768)
    gemma_like = replace(dense, sliding_window=1024, global_every=6)
    share = window_share(gemma_like)
    # 27 of 32 layers over 1024 keys, 5 over the whole prefix
    assert share == pytest.approx((5 + 27 * 1024 * 2 / 32768) / 32, rel=0.01)
    a, b = (estimate(_plan((8, 1)), m, train) for m in (dense, gemma_like))
    assert b.time.attention < 0.3 * a.time.attention
    assert b.model_flops < a.model_flops
    assert b.memory_bytes == a.memory_bytes  # a window changes work, not what a layer keeps


def test_the_unbalanced_step_is_priced_above_the_balanced_one() -> None:
    """8 H100s at 128k with CP 4 (issue 51's check): contiguous causal shards wait for the
    last one, 1.75x the mean attention work."""
    model = _llama(131072)
    train = TrainSpec(global_batch=2, remat="full")
    plan = _plan((2, 4))
    even = estimate(plan, model, train)
    uneven = estimate(plan, model, replace(train, context_load_balance=False))
    assert uneven.time.attention == pytest.approx(1.75 * even.time.attention, rel=1e-4)
    assert uneven.step_seconds >= 1.2 * even.step_seconds


def test_the_sequence_axis_shards_the_weights_as_fsdp_does() -> None:
    model = _llama(65536)
    train = TrainSpec(global_batch=1, remat="full")
    fsdp = estimate(_plan((8, 1)), replace(model, seq_len=8192), replace(train, global_batch=8))
    seq = estimate(_plan((1, 8)), model, train)
    for term in ("params", "gradients", "optimizer"):
        assert seq.terms[term] == fsdp.terms[term], term
    kinds = {(c.kind, c.what) for c in seq.axes["seq"].collectives}
    assert ("all-gather", "layer weights") in kinds
    assert ("all-gather", "keys and values") in kinds


def test_the_ring_passes_blocks_beside_the_attention() -> None:
    model = _llama(131072)
    train = TrainSpec(global_batch=2, remat="full", context_strategy="ring")
    ring = estimate(_plan((2, 4)), model, train)
    gather = estimate(_plan((2, 4)), model, replace(train, context_strategy="all_gather"))
    permutes = [c for c in ring.axes["seq"].collectives if c.kind == "collective-permute"]
    assert permutes and all(c.overlaps for c in permutes)
    assert not any(c.what == "keys and values" for c in ring.axes["seq"].collectives)
    # the same bytes in blocks: c - 1 hops of one shard's keys and values
    gathered = next(c for c in gather.axes["seq"].collectives if c.what == "keys and values")
    assert permutes[0].bytes * 4 == gathered.bytes
    assert ring.axes["seq"].exposed_seconds < gather.axes["seq"].exposed_seconds


def test_choose_mesh_cuts_the_sequence_where_whole_sequences_do_not_fit() -> None:
    """LLaMA-3 70B at 128k, 64 sequences on 512 TPU7x chips (issue 51): fewer sequences than
    the batch axes could take, so the winner cuts them, and the ranking says why; both
    strategies are searched."""
    model = replace(ModelSpec.from_name("llama3-70b"), seq_len=131072)
    ranking = choose_mesh("tpu-7x-512", model, TrainSpec(global_batch=64), top=5)
    best = ranking[0].estimate
    assert best.mesh["seq"] > 1
    assert any("sequence axis where whole sequences fit" in why for why in ranking.pruned)
    text = ranking_text(ranking)
    assert "sequence axis: choice 1 cuts each sequence" in text
    assert "64 sequences do not fill" in text
    # the strategy searched: the winner's beats the other one on the same mesh and recipe
    other = {"ring": "all_gather", "all_gather": "ring"}[best.train.context_strategy]
    priced = estimate(ranking[0].plan, model, replace(best.train, context_strategy=other))
    assert priced.step_seconds >= best.step_seconds
