"""Attention's work at the run's sequence length: the query-key pairs a causal or sliding-window
mask keeps (ModelSpec.window), over the whole sequence and on the sequence axis's busiest
shard, with the sequence in contiguous chunks or load-balanced (TrainSpec.context_load_balance:
shard i holds chunks i and 2c - 1 - i of 2c). Pure arithmetic on positions; the kernels skip
the blocks a mask removes, so a shard's time follows the pairs it keeps."""

from __future__ import annotations

from functools import lru_cache

from ...workload.spec import ModelSpec


def prefix_pairs(n: int, window: int) -> int:
    """Pairs the first `n` queries keep: query i sees keys max(0, i - window + 1)..i, or 0..i
    without a window (0)."""
    if not window or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def span_pairs(start: int, stop: int, window: int) -> int:
    """Pairs the queries at positions start..stop-1 keep."""
    return prefix_pairs(stop, window) - prefix_pairs(start, window)


def shard_pairs(seq_len: int, shards: int, window: int, *, balanced: bool) -> list[int]:
    """The pairs each of `shards` sequence shards keeps for one sequence and layer."""
    if shards == 1:
        return [prefix_pairs(seq_len, window)]
    if not balanced:
        size = seq_len // shards
        return [span_pairs(i * size, (i + 1) * size, window) for i in range(shards)]
    size = seq_len // (2 * shards)
    return [
        span_pairs(i * size, (i + 1) * size, window)
        + span_pairs((2 * shards - 1 - i) * size, (2 * shards - i) * size, window)
        for i in range(shards)
    ]


@lru_cache(maxsize=4096)
def mean_pairs(model: ModelSpec, shards: int = 1, *, balanced: bool = True) -> float:
    """A layer's pairs on the busiest of `shards` sequence shards for one sequence, averaged
    over the model's layers (each with its window): what every shard waits for, since the
    shards run each layer in lockstep."""
    windows = [model.window(i) for i in range(model.num_layers)]
    busiest = {
        w: max(shard_pairs(model.seq_len, shards, w, balanced=balanced)) for w in set(windows)
    }
    return sum(busiest[w] for w in windows) / len(windows)


def window_share(model: ModelSpec) -> float:
    """The model's mean pairs a layer over a causal layer's (1 without a window): what its
    windows leave of causal attention's FLOPs."""
    if not model.sliding_window:
        return 1.0
    return mean_pairs(model) / prefix_pairs(model.seq_len, 0)


def imbalance(model: ModelSpec, shards: int, *, balanced: bool) -> float:
    """The busiest shard's pairs over the mean shard's: 1 when balanced and the chunks are
    even, (2c - 1) / c for contiguous causal shards (1.875 at c = 8)."""
    mean = mean_pairs(model) / shards
    return mean_pairs(model, shards, balanced=balanced) / mean
