"""How many rows a dropless MoE exchange sends one peer (workload/moe.py runs it, cost/parts/
moe.py prices it): the most copies one device's tokens can route to one peer's experts.

A token's k experts are distinct, so under learned routing a peer holding E / P experts gets at
most min(k, E / P) copies of each token. Under balanced routing (token i to experts (i k + j)
mod E) a run of L tokens with consecutive global indices gives L k consecutive copy indices, so
each expert at most ceil(L k / E) of them; summed over a device's runs, an expert gets at most
floor(t k / E) + runs copies, and a peer E / P times that. At DeepSeek-V3's 4096 tokens, k 8,
E 256 and P 64 that is 516 rows a peer against the learned bound's 16,384.
"""

from __future__ import annotations

from .spec import Routing


def peer_rows(tokens: int, k: int, experts: int, ep: int, *, routing: Routing, runs: int) -> int:
    """Rows of the send buffer's block for one peer: `tokens` a device routes, `k` experts a
    token, `experts` in all over an expert axis of `ep`; `runs` the stretches of consecutive
    global token indices the device's tokens make (balanced routing reads them)."""
    local = experts // ep
    worst = tokens * min(k, local)
    if routing != "balanced":
        return worst
    return min(worst, local * (tokens * k // experts + runs))


def token_runs(rows: int, *, seq_split: bool, load_balanced: bool) -> int:
    """The runs of consecutive global indices in a device's `rows` x its slice of the sequence:
    one where it holds whole sequences of adjacent rows, else one a row (two under the
    load-balanced order, which gives a device two chunks of each sequence)."""
    if not seq_split:
        return 1
    return rows * (2 if load_balanced else 1)
