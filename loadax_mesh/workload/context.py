"""Context parallelism on the `seq` axis (docs/design.md section 14): the order the step holds
a sequence's tokens in, and the reorder of a batch into it.

With `TrainSpec.context_load_balance` (the default) and a `seq` axis of size c > 1 the
sequence is cut into 2c chunks and device i holds chunks i and 2c - 1 - i (MaxText's
dual-chunk-swap, `max_utils.reorder_sequence`; Megatron's zigzag; torchtitan's head-tail), so
that causal attention's work is the same on every device. The step permutes the tokens and
targets of a batch into that order once, at its input; rotary positions and attention masks
(causal and local) follow each slot's position; the loss, a mean over tokens, does not see
the order. Without balance, or without a `seq` axis, the order is the sequence's own.
`layout.check_fit` refuses a sequence the chunks do not divide.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from .layout import Roles
from .spec import TrainSpec


def chunk_order(shards: int) -> tuple[int, ...]:
    """The 2 x `shards` chunks of the sequence in the load-balanced order: device i's slice is
    chunks i and 2 shards - 1 - i (shards 2: 0, 3, 1, 2)."""
    return tuple(c for i in range(shards) for c in (i, 2 * shards - 1 - i))


def balanced(train: TrainSpec, r: Roles) -> bool:
    """Whether the step holds the sequence in the load-balanced order."""
    return train.context_load_balance and r.size("seq") > 1


def token_positions(seq_len: int, train: TrainSpec, r: Roles) -> np.ndarray | None:
    """Each token slot's position in the sequence [seq_len] (int32) in the step's order; None
    where that is the sequence's own order."""
    if not balanced(train, r):
        return None
    order = chunk_order(r.size("seq"))
    size = seq_len // len(order)
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in order]).astype(np.int32)


def reordered(batch: dict[str, Any], positions: np.ndarray | None) -> dict[str, Any]:
    """The batch's [rows, seq] arrays (tokens, targets) with each slot's token the one at its
    position: the load-balanced order, gathered once per batch; unchanged for None."""
    if positions is None:
        return batch
    index = jnp.asarray(positions)
    return {k: jnp.take(v, index, axis=1) for k, v in batch.items()}
