"""Host-contiguous rings: one axis's ring that visits each host's chips one after another.

A TPU host holds a box of chips (2x2x1 on v4, v5p and 7x, 2x2 on v5e and v6e). When an axis's
ring runs through several hosts, the batch rows of a host are one contiguous range only if the
ring visits that host's chips consecutively. The plain constructions do not: a snake crosses a
2x2 block twice. Here a ring through the grid of host blocks (the coarse grid) is lifted: each
block is crossed by a Hamiltonian path through its cells, from the cell next to the previous
block's exit to a cell next to the following block. Which cells those are is a shortest-path
choice around the cycle (a few states per block), solved exactly by dynamic programming; the
lift is kept only when it costs no more hops than the plain ring.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from .rings import Factor, Ring, cycle_hops, factor_orders, ring_digits

_MAX_CELLS = 16  # a host's cells on one axis line; paths are enumerated exhaustively


def host_cells(chip: Sequence[Factor], host_block: Sequence[int]) -> tuple[int, ...] | None:
    """Per chip factor, how many of its positions one host spans (1: each in another host).

    None when the factor does not line up with the hosts (a host's chips straddle two lines or
    a line ends inside a host): then no ring keeps hosts together on this axis.
    """
    cells = []
    for f in chip:
        block = host_block[f.dim]
        if f.stride % block == 0:
            cells.append(1)
        elif block % f.stride == 0 and f.size % (block // f.stride) == 0:
            cells.append(block // f.stride)
        else:
            return None
    return tuple(cells)


def lift_ring(ring: Ring, cells: Sequence[int]) -> Ring | None:
    """A ring through `ring`'s factors, no dearer than `ring`, that keeps every block of
    `cells` (per chip factor) consecutive; `ring` itself when that is trivially so, None when
    no such ring is found."""
    chip = ring.chip
    blocks = [f.size // c for f, c in zip(chip, cells, strict=True)]
    if math.prod(cells) == 1 or math.prod(blocks) == 1:
        return ring
    if math.prod(cells) > _MAX_CELLS:
        return None
    local, intra, paths = _block_paths(tuple(cells), tuple(f.hops(1) for f in chip))
    coarse_factors = tuple(
        f._replace(size=b, stride=f.stride * c) for f, b, c in zip(chip, blocks, cells, strict=True)
    )
    for order, method in _coarse_cycles(coarse_factors):
        coarse = np.zeros((math.prod(blocks), len(chip)), np.int64)
        coarse[:, list(order)] = ring_digits(
            Ring(tuple(coarse_factors[i] for i in order), (), method, 0)
        )
        found = _cheapest_lift(chip, np.asarray(cells), local, intra, coarse, ring.hops)
        if found is not None:
            hops, entries, exits = found
            walk = [paths[e][x] for e, x in zip(entries.tolist(), exits.tolist(), strict=True)]
            digits = (coarse * np.asarray(cells))[:, None, :] + local[np.array(walk)]
            return replace(ring, method="lifted", hops=hops, path=digits.reshape(-1, len(chip)))
    return None


def _coarse_cycles(factors: tuple[Factor, ...]) -> Iterator[tuple[tuple[int, ...], str]]:
    """Cycles through the coarse grid (factor positions in order, method), cheapest first."""
    moving = [i for i, f in enumerate(factors) if f.size > 1]
    found: list[tuple[int, tuple[int, ...], str]] = []
    for perm in factor_orders(tuple(factors[i] for i in moving)):
        order = tuple(moving[[factors[i] for i in moving].index(f)] for f in perm)
        costs = [(f.size, f.hops(1), f.hops(f.size - 1)) for f in perm]
        methods = ("snake", "lane_outer", "lane_inner") if len(perm) > 1 else ("snake",)
        found.extend((cycle_hops(costs, m), order, m) for m in methods)
    found.sort(key=lambda t: t[0])
    for _, order, method in found:
        yield order, method


@functools.lru_cache(maxsize=64)
def _block_paths(
    cells: tuple[int, ...], step: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, list[list[list[int]]]]:
    """A block's cells (digits per factor, `cells[i]` positions along factor i, a move along
    it costing `step[i]` hops), and the cheapest Hamiltonian path between every pair of them
    (cost, inf where none exists; cells in order). Read-only: the answer is cached."""
    local = np.array(list(itertools.product(*(range(c) for c in cells))), np.int64)
    n = len(local)
    near = [[j for j in range(n) if np.abs(local[i] - local[j]).sum() == 1] for i in range(n)]
    cost = np.full((n, n), np.inf)
    best: list[list[list[int]]] = [[[] for _ in range(n)] for _ in range(n)]

    def walk(path: list[int], spent: int) -> None:
        if len(path) == n:
            a, b = path[0], path[-1]
            if spent < cost[a, b]:
                cost[a, b], best[a][b] = spent, list(path)
            return
        here = path[-1]
        for nxt in near[here]:
            if nxt not in path:
                moved = int(step[np.abs(local[nxt] - local[here]).argmax()])
                walk([*path, nxt], spent + moved)

    for start in range(n):
        walk([start], 0)
    local.flags.writeable = cost.flags.writeable = False
    return local, cost, best


def _cheapest_lift(
    chip: Sequence[Factor],
    cells: np.ndarray,
    local: np.ndarray,
    intra: np.ndarray,
    coarse: np.ndarray,
    budget: int,
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The cheapest choice of entry and exit cell per block around the coarse cycle `coarse`:
    (hops, entry cells, exit cells), or None when it costs more than `budget`."""
    delta = np.roll(coarse, -1, axis=0) - coarse
    span = 2 * coarse.max(initial=0) + 1
    code = (delta + span // 2) @ span ** np.arange(delta.shape[1])
    _, first, which = np.unique(code, return_index=True, return_inverse=True)
    kinds = delta[first]
    stride = np.array([f.stride for f in chip], np.int64)
    extent = np.array([f.extent for f in chip], np.int64)
    wrap = np.array([f.wrap for f in chip])
    # units[k, x, e]: per factor, the positions between exit cell x and the next entry cell e.
    units = kinds[:, None, None, :] * cells + local[None, None, :, :] - local[None, :, None, :]
    d = np.abs(units) * stride
    d = np.where(wrap, np.minimum(d, extent - d), d).sum(axis=-1)
    # step[k, e, e']: enter at e, leave by the cheapest exit, enter the next block at e'.
    through = intra[None, :, :, None] + d[:, None, :, :]
    exit_of = through.argmin(axis=2)
    step = through.min(axis=2)
    loop, entries = _cheapest_cycle(step[which])
    if loop > budget:
        return None
    exits = exit_of[which, entries[:-1], entries[1:]]
    return int(loop), entries[:-1], exits


def _cheapest_cycle(steps: np.ndarray) -> tuple[float, np.ndarray]:
    """The cheapest closed walk through a chain of (state x state) step costs `steps`:
    (its cost, the state before each step and after the last, which is the first).

    The min-plus product of the chain is taken pairwise, log2(len(steps)) vectorised rounds,
    keeping each product's middle states; the walk is then read back top-down.
    """
    n = steps.shape[1]
    identity = np.where(np.eye(n, dtype=bool), 0.0, np.inf)
    mats, middles, counts = steps, [], []
    while len(mats) > 1:
        counts.append(len(mats))
        if len(mats) % 2:
            mats = np.concatenate([mats, identity[None]])
        total = mats[0::2, :, :, None] + mats[1::2, None, :, :]  # (pair, in, middle, out)
        middles.append(total.argmin(axis=2))
        mats = total.min(axis=2)
    loop = np.diagonal(mats[0])
    start = int(loop.argmin())
    ins = outs = np.array([start])
    for middle, count in zip(reversed(middles), reversed(counts), strict=True):
        mid = middle[np.arange(len(ins)), ins, outs]
        ins, outs = np.stack([ins, mid], axis=1), np.stack([mid, outs], axis=1)
        ins, outs = ins.ravel()[:count], outs.ravel()[:count]
    return float(loop[start]), np.append(ins, start)
