"""The dropless exchange's block a peer (workload/dispatch.py) against every device's copies
counted by brute force, under the step's balanced routing (workload/moe.py `_balanced`: token
i to experts (i k + j) mod E, i its row-major index in the global batch, a slot's column its
position under the load-balanced order, context.py's `chunk_order`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loadax_mesh.workload.context import chunk_order
from loadax_mesh.workload.dispatch import peer_rows, token_runs


def most_sent(rows, seq, batch_shards, seq_shards, k, experts, ep, balanced):
    """The most copies any device sends any peer."""
    b, s = rows // batch_shards, seq // seq_shards
    parts = 2 * seq_shards if balanced else seq_shards
    chunks = np.arange(seq).reshape(parts, -1)
    order = chunk_order(seq_shards) if balanced else range(parts)
    positions = np.concatenate([chunks[c] for c in order])
    local, most = experts // ep, 0
    for i in range(batch_shards):
        for j in range(seq_shards):
            index = np.arange(i * b, (i + 1) * b)[:, None] * seq + positions[j * s : (j + 1) * s]
            copies = (index.reshape(-1, 1) * k + np.arange(k)) % experts
            most = max(most, np.bincount((copies // local).ravel(), minlength=ep).max())
    return int(most)


@settings(max_examples=300, deadline=None)
@given(
    batch_shards=st.sampled_from([1, 2, 4]),
    row_mult=st.integers(1, 3),
    seq_shards=st.sampled_from([1, 2, 4]),
    seq_mult=st.integers(1, 12),
    balanced=st.booleans(),
    k=st.integers(1, 8),
    ep_log=st.integers(0, 4),
    experts_mult=st.integers(1, 4),
)
def test_no_device_sends_a_peer_more_than_its_block(
    batch_shards, row_mult, seq_shards, seq_mult, balanced, k, ep_log, experts_mult
):
    ep = 2**ep_log
    experts = max(k, ep * experts_mult)
    experts += -experts % ep  # an expert axis divides the experts
    balanced = balanced and seq_shards > 1
    rows, seq = batch_shards * row_mult, 2 * seq_shards * seq_mult
    b, s = rows // batch_shards, seq // seq_shards
    runs = token_runs(b, seq_split=seq_shards > 1, load_balanced=balanced)
    block = peer_rows(b * s, k, experts, ep, routing="balanced", runs=runs)
    assert most_sent(rows, seq, batch_shards, seq_shards, k, experts, ep, balanced) <= block
    learned = peer_rows(b * s, k, experts, ep, routing="learned", runs=runs)
    assert block <= learned == b * s * min(k, experts // ep)


def test_balanced_blocks_hold_about_the_copies_where_learned_ones_hold_the_worst_case():
    """DeepSeek-V3 at 4096 tokens a device, k 8 of 256 experts, expert axis 64: the learned
    bound is 32 times the copies, the balanced one 1.008 times; both hold what is sent."""
    tokens, k, experts, ep = 4096, 8, 256, 64
    balanced = peer_rows(tokens, k, experts, ep, routing="balanced", runs=1)
    learned = peer_rows(tokens, k, experts, ep, routing="learned", runs=1)
    assert (balanced, learned) == (516, 16384)
    assert most_sent(64 * 1, 4096, 64, 1, k, experts, ep, False) == 512
