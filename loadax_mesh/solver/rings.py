"""One ring through one axis's share of the torus: the factors, the cycle constructions and
their costs, shared by the torus solver (torus.py) and host-contiguous lifting (hostrings.py).

A factor is an axis's share of one physical dim (`size` positions `stride` apart). A ring runs
through the grid of an axis's chip factors (the cores of a chip innermost, 0 hops apart) as a
Hamiltonian cycle; `best_ring` tries a few constructions in every factor order and keeps the
cheapest in hops.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class Factor(NamedTuple):
    """One axis's share of one physical dim: `size` positions, `stride` apart."""

    dim: int  # index into (*chip_shape, cores)
    size: int
    stride: int
    extent: int  # the dim's size
    wrap: bool
    free: bool  # the cores of a chip: moving along it costs no hop

    def hops(self, units: int) -> int:
        """Hops between two positions `units` apart along this factor."""
        if self.free:
            return 0
        d = abs(units) * self.stride
        return min(d, self.extent - d) if self.wrap else d


@dataclass(frozen=True)
class Ring:
    """How one axis's ring runs: through the `chip` factors (inner first) by `method`, with the
    `cores` factors innermost. `hops` is the cost of one ring, as docs/design.md section 5 counts
    it. A "lifted" ring (hostrings.py) carries its chip digits in `path`."""

    chip: tuple[Factor, ...]
    cores: tuple[Factor, ...]
    method: str  # "snake", "lane_outer", "lane_inner" or "lifted"
    hops: int
    path: np.ndarray | None = field(default=None, compare=False, repr=False)


def best_ring(factors: tuple[Factor, ...]) -> Ring:
    """The cheapest of a few Hamiltonian-cycle constructions through the factors' grid.

    The cores of a chip go innermost (consecutive devices of a ring share a chip there); the
    chip factors are tried in every order with three constructions: a closed snake
    (boustrophedon: a ring when its outermost factor wraps or has size 2) and two "lane" cycles
    that snake through all but one row or column and come back along it (a ring on any grid of
    even size, with or without wraparound).
    """
    cores = tuple(f for f in factors if f.free)
    chip = tuple(f for f in factors if not f.free)
    count = math.prod(f.size for f in chip)
    if count == 1:
        return Ring(chip, cores, "snake", 0)
    if count == 2:  # one pair; around a ring it is crossed twice when the cores come along
        return Ring(chip, cores, "snake", chip[0].hops(1) * (2 if cores else 1))
    floor = count * min(f.hops(1) for f in chip)  # no cycle can cost less: stop there
    best: Ring | None = None
    for perm in factor_orders(chip):
        costs = [(f.size, f.hops(1), f.hops(f.size - 1)) for f in perm]
        for method in ("snake", "lane_outer", "lane_inner") if len(perm) > 1 else ("snake",):
            hops = cycle_hops(costs, method)
            if best is None or hops < best.hops:
                best = Ring(perm, cores, method, hops)
                if hops <= floor:
                    return best
    assert best is not None
    return best


def factor_orders(chip: tuple[Factor, ...]) -> Iterator[tuple[Factor, ...]]:
    """The factor orders worth trying (factors equal but for their dim are interchangeable)."""
    seen = set()
    for perm in itertools.permutations(chip):
        shape = tuple(f[1:] for f in perm)
        if shape not in seen:
            seen.add(shape)
            yield perm


Costs = list[tuple[int, int, int]]  # per factor, inner first: (size, hops of 1 step, of size-1)


def _snake_costs(costs: Costs) -> tuple[int, int]:
    """(hops along, hops back from last to first) of a boustrophedon path, inner factor first.

    Factor i moves (size - 1) times per sweep and sweeps once per position of the factors
    outside it; it ends at its last position when that count is odd, else back at 0.
    """
    along = back = 0
    sweeps = 1
    for size, step, span in reversed(costs):
        along += (size - 1) * sweeps * step
        back += span if sweeps % 2 else 0
        sweeps *= size
    return along, back


def cycle_hops(costs: Costs, method: str) -> int:
    """Hops of one full cycle built by `method` through factors `costs` (inner first)."""
    if method == "snake":
        along, back = _snake_costs(costs)
        return along + back
    (r, x_step, x_span), inner = costs[-1], costs[:-1]
    c = math.prod(size for size, _, _ in inner)
    along, back = _snake_costs(inner)
    if method == "lane_outer":
        # For each inner position: x runs over 1..r-1 back and forth; home along x = 0.
        end = x_span if c % 2 else x_step
        return c * (r - 2) * x_step + 2 * along + end + x_step
    # lane_inner: for each x: the inner path runs over its positions 1..c-1 back and forth;
    # home along inner position 0.
    first = inner[0][1]
    end = back if r % 2 else first
    return r * (along - first) + 2 * (r - 1) * x_step + end + first


def _snake(sizes: Sequence[int]) -> np.ndarray:
    """Boustrophedon order over a grid (inner size first): (count, len(sizes)) digits."""
    count = math.prod(sizes)
    t = np.arange(count, dtype=np.int64)
    digits = np.empty((count, len(sizes)), np.int64)
    below = 1
    for i, n in enumerate(sizes):
        raw = (t // below) % n
        sweep = t // (below * n)  # completed sweeps of this digit: odd ones run backwards
        digits[:, i] = np.where(sweep % 2 == 1, n - 1 - raw, raw)
        below *= n
    return digits


def ring_digits(ring: Ring) -> np.ndarray:
    """The ring as digits, one column per factor: `ring.chip` in order, then `ring.cores`."""
    fs = ring.chip
    count = math.prod(f.size for f in fs)
    if ring.path is not None:
        chip = ring.path
    elif ring.method == "snake" or len(fs) < 2:
        chip = _snake([f.size for f in fs])
    else:
        r = fs[-1].size
        inner = _snake([f.size for f in fs[:-1]])
        c = len(inner)
        if ring.method == "lane_outer":
            y = np.repeat(np.arange(c), r - 1)
            k = np.tile(np.arange(r - 1), c)
            x = np.where(y % 2 == 0, 1 + k, r - 1 - k)
            y = np.concatenate([y, np.arange(c - 1, -1, -1)])
            x = np.concatenate([x, np.zeros(c, np.int64)])
        else:
            x = np.repeat(np.arange(r), c - 1)
            k = np.tile(np.arange(c - 1), r)
            y = np.where(x % 2 == 0, 1 + k, c - 1 - k)
            x = np.concatenate([x, np.arange(r - 1, -1, -1)])
            y = np.concatenate([y, np.zeros(r, np.int64)])
        chip = np.column_stack([inner[y], x])
    assert len(chip) == count
    if not ring.cores:
        return chip
    core = _snake([f.size for f in ring.cores])
    return np.concatenate(
        [np.repeat(chip, len(core), axis=0), np.tile(core, (len(chip), 1))], axis=1
    )
