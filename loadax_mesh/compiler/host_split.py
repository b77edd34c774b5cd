"""Which bytes of a collective stay inside a host and which cross hosts (docs/design.md section 6).

The compiler does not see hosts: a program for 2 hosts of 8 GPUs is the program for one host of
16. Here each device of the program is given a key (its host, `process_index`; or its granule,
the plan's ICI island: a GPU NVLink domain, a TPU slice) and each collective's bytes are split
by its replica groups. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from .replica_groups import distinct_per_row

RINGS = ("all-gather", "reduce-scatter", "all-reduce")


def across_fraction(kind: str, groups: np.ndarray | None, keys: np.ndarray) -> float | None:
    """The share of a collective's bytes that crosses between keys (hosts or granules), with
    `keys[p]` the key of the device at position p of the program's device assignment; None
    when the groups are unreadable.

    - all-gather, reduce-scatter, all-reduce: a ring through a group's n members that visits
      each key's members one after another (as NCCL orders its rings, inside a node first) has
      h steps between keys when the members sit on h > 1 keys, none when h = 1. Every step
      carries the same bytes, so h / n of them cross.
    - all-to-all: every member sends 1/n of its buffer to each member; what it sends to
      members on other keys crosses.
    - collective-permute: the (source, target) pairs whose ends sit on different keys.

    Averaged over the groups (every device sits in one group of equal size).
    """
    if groups is None or not groups.size or groups.max() >= len(keys):
        return None
    member_keys = keys[groups]  # (groups, members)
    n = groups.shape[1]
    if kind == "collective-permute":
        return float(np.mean(member_keys[:, 0] != member_keys[:, -1]))
    if kind == "all-to-all":  # per member: the members of its group on its own key
        key = np.unique(member_keys, return_inverse=True)[1].reshape(member_keys.shape)
        cell = np.arange(len(key))[:, None] * (key.max() + 1) + key
        same = np.bincount(cell.ravel())[cell]
        return float(np.mean((n - same) / n))
    if kind in RINGS:
        distinct = distinct_per_row(member_keys)
        return float(np.mean(np.where(distinct > 1, distinct / n, 0.0)))
    return None


def across_bytes(kind: str, size: int, groups: np.ndarray | None, keys: np.ndarray) -> int | None:
    """`size` bytes of one collective times `across_fraction`, rounded to whole bytes."""
    fraction = across_fraction(kind, groups, keys)
    return None if fraction is None else round(size * fraction)
