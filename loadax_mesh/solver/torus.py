"""ICI rings on a TPU torus: which physical dims each mesh axis takes, and in what order.

A granule is a grid of physical dims: the chip dims (a ring where the dim wraps, else a path)
and, last, the cores of a chip (0 hops apart). Each logical axis takes a factor of every
physical dim (1 for most). Inside a dim shared by several axes the later, more
communication-intensive axis takes the inner, contiguous factor and an earlier axis the outer,
strided one. Every line of an axis is then a translate of one ring through that axis's own
factors, so one ring is solved per axis (a cheap Hamiltonian cycle through the factors' grid,
the cores of a chip next to each other) and the mesh is the outer sum of the axes' rings.

The factors are chosen by an exact search over the axes from last to first: the largest sum of
ring efficiencies wins (later axes weigh a little more), ties going to fewer hops on the last
axis, then the one before it. An
axis's hops depend only on its own factors and on the strides the later axes leave it, so each
state (axis, factors left) is solved once. Any shape whose product is the granule's device
count has an assignment (each prime's exponents can always be shared out), prime factors such
as the 5 and 7 of a 16x20x28 pod included.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import MeshConfigError
from .hostrings import host_cells, lift_ring
from .rings import Factor, Ring, best_ring, ring_digits


@dataclass(frozen=True)
class TorusSolution:
    """The solver's answer: per axis its factors and ring, and the position grid."""

    dims: tuple[int, ...]  # (*chip_shape, cores_per_chip)
    assignment: np.ndarray  # (physical dims, axes): the factor each axis takes of each dim
    rings: tuple[Ring, ...]
    order: np.ndarray  # shaped like the ICI mesh, holding granule positions
    # Per axis: does its ring keep each host's chips consecutive? None: no host block given.
    host_contiguous: tuple[bool | None, ...] = ()


def order_torus(
    chip_shape: tuple[int, ...],
    ici_mesh_shape: tuple[int, ...],
    *,
    wrap: tuple[bool, ...],
    cores_per_chip: int = 1,
    host_block: tuple[int, ...] | None = None,
) -> np.ndarray:
    """An int array of shape `ici_mesh_shape` holding granule positions, where a position is
    `np.ravel_multi_index((*chip_coords, core), (*chip_shape, cores_per_chip))`."""
    return solve_torus(
        chip_shape, ici_mesh_shape, wrap=wrap, cores_per_chip=cores_per_chip, host_block=host_block
    ).order


def solve_torus(
    chip_shape: Sequence[int],
    ici_mesh_shape: Sequence[int],
    *,
    wrap: Sequence[bool],
    cores_per_chip: int = 1,
    host_block: Sequence[int] | None = None,
) -> TorusSolution:
    """Assign physical factors to the axes of `ici_mesh_shape` and order each axis as a ring.

    With `host_block` (one host's chips per chip dim, tiling the torus), an axis's ring keeps
    each host's chips consecutive whenever that costs no hop (hostrings.py).
    """
    chips = tuple(int(n) for n in chip_shape)
    sizes = tuple(int(n) for n in ici_mesh_shape)
    wraps = tuple(bool(w) for w in wrap)
    if len(wraps) != len(chips):
        raise MeshConfigError(
            f"wrap={tuple(wrap)} has {len(wraps)} entries but chip_shape={chips} has "
            f"{len(chips)} dims; accepted: one flag per chip dim"
        )
    if min(chips, default=0) < 1 or cores_per_chip < 1 or min(sizes, default=0) < 1:
        raise MeshConfigError(
            f"chip_shape={chips}, cores_per_chip={cores_per_chip}, ici_mesh_shape={sizes}; "
            "accepted: positive sizes"
        )
    block = None if host_block is None else tuple(int(n) for n in host_block)
    if block is not None and (
        len(block) != len(chips) or any(b < 1 or c % b for b, c in zip(block, chips, strict=True))
    ):
        raise MeshConfigError(
            f"host_block={tuple(host_block or ())} does not tile chip_shape={chips}; accepted: "
            "one positive divisor of each chip dim, or None"
        )
    dims = (*chips, cores_per_chip)
    if math.prod(sizes) != math.prod(dims):
        raise MeshConfigError(
            f"ici_mesh_shape={sizes} needs {math.prod(sizes)} devices but the torus {chips} x "
            f"{cores_per_chip} cores holds {math.prod(dims)}; accepted: a shape whose product "
            "is the granule's device count"
        )
    free = (False,) * len(chips) + (True,)
    wraps = (*wraps, False)
    columns = _search(dims, wraps, free, sizes)
    assignment = np.array(columns, dtype=np.int64).T.reshape(len(dims), len(sizes))
    rings = []
    contiguous: list[bool | None] = []
    strides = [1] * len(dims)
    parts: list[np.ndarray] = [np.zeros(1, np.int64)] * len(sizes)
    dim_step = [math.prod(dims[p + 1 :]) for p in range(len(dims))]
    for axis in reversed(range(len(sizes))):
        factors = tuple(
            Factor(p, a, strides[p], dims[p], wraps[p], free[p])
            for p, a in enumerate(columns[axis])
            if a > 1
        )
        ring = best_ring(factors)
        if block is not None:
            cells = host_cells(ring.chip, block)
            lifted = None if cells is None else lift_ring(ring, cells)
            contiguous.append(lifted is not None)
            ring = lifted if lifted is not None else ring
        rings.append(ring)
        digits = ring_digits(ring)
        weights = [f.stride * dim_step[f.dim] for f in (*ring.chip, *ring.cores)]
        parts[axis] = digits @ np.asarray(weights, np.int64) if weights else parts[axis]
        for p, a in enumerate(columns[axis]):
            strides[p] *= a
    order = parts[0]
    for part in parts[1:]:
        order = np.add.outer(order, part)
    return TorusSolution(
        dims,
        assignment,
        tuple(reversed(rings)),
        np.asarray(order, np.int64).reshape(sizes),
        tuple(reversed(contiguous)) if block is not None else (None,) * len(sizes),
    )


# -- choosing factors ----------------------------------------------------------------------


def _search(
    dims: tuple[int, ...], wraps: tuple[bool, ...], free: tuple[bool, ...], sizes: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """Per axis, the factor it takes of every dim.

    The aim, compared as a tuple: the largest weighted sum over axes of ring efficiency
    (steps / hops, weights in `_weight`), then the fewest hops on the last axis, then on the one
    before it, and so on. An axis's hops
    depend only on its factors and on the factors left to it (which fix its strides), so the
    best completion of a state (axis, factors left) is computed once.
    """
    count = len(sizes)
    Value = tuple[Fraction, ...]
    memo: dict[tuple[int, tuple[int, ...]], tuple[Value, tuple[tuple[int, ...], ...]]] = {}
    ring_memo: dict[tuple[Factor, ...], int] = {}
    cores = dims[-1]
    # The cores of a chip go together to the last axis that can hold them all.
    core_axis = max((a for a, n in enumerate(sizes) if n % cores == 0), default=-1)
    # The most efficiency axes 0..a can reach together: once met, no other choice is better.
    ceiling = list(
        itertools.accumulate(
            _weight(a) * _best_efficiency(n, cores if core_axis in (a, -1) else 1)
            for a, n in enumerate(sizes)
        )
    )

    def best(axis: int, left: tuple[int, ...]) -> tuple[Value, tuple[tuple[int, ...], ...]]:
        if axis < 0:
            return (Fraction(0),) * (count + 1), ()
        key = (axis, left)
        if key in memo:
            return memo[key]
        found: tuple[Value, tuple[tuple[int, ...], ...]] | None = None
        for column in _columns(left, sizes[axis]):
            if axis >= core_axis >= 0 and column[-1] != (cores if axis == core_axis else 1):
                continue
            factors = tuple(
                Factor(p, a, dims[p] // left[p], dims[p], wraps[p], free[p])
                for p, a in enumerate(column)
                if a > 1
            )
            hops = ring_memo.get(factors)
            if hops is None:
                hops = ring_memo[factors] = best_ring(factors).hops
            mine = _weight(axis) * _efficiency(sizes[axis], hops)
            if found is not None and mine + (ceiling[axis - 1] if axis else 0) < found[0][0]:
                continue  # even the best completion would lose
            rest, columns = best(axis - 1, tuple(n // a for n, a in zip(left, column, strict=True)))
            value = list(rest)
            value[0] += mine
            value[count - axis] -= hops
            if found is None or tuple(value) > found[0]:
                found = (tuple(value), (*columns, column))
                if value[0] >= ceiling[axis]:
                    break
        if found is None:  # cannot happen: the prime exponents always balance
            raise MeshConfigError(f"ici_mesh_shape={sizes} cannot be laid on dims {dims}")
        memo[key] = found
        return found

    return list(best(count - 1, dims)[1])


def _weight(axis: int) -> Fraction:
    """How much axis `axis`'s efficiency counts: 1, 1.1, 1.2, ... A later axis carries more
    traffic, so near-ties go its way (v5e 16x16 as (64, 4): a 2x2 ring for the 4, not a line)
    while the sum still rules (the later axis never takes a ring that costs earlier axes more)."""
    return Fraction(10 + axis, 10)


def _efficiency(size: int, hops: int) -> Fraction:
    """Ring steps per hop of one ring of `size` devices; a ring on one chip counts half a hop."""
    steps = size if size > 2 else size - 1
    return Fraction(steps, hops) if hops else Fraction(2 * steps)


def _best_efficiency(size: int, cores: int) -> Fraction:
    """What `_efficiency` can reach at best on an axis of `size` holding `cores` per chip."""
    chips = size // cores
    if chips == 1:
        return _efficiency(size, 0)
    return Fraction(size if size > 2 else 1, chips if chips > 2 else 2 if cores > 1 else 1)


def _columns(left: tuple[int, ...], size: int) -> Iterator[tuple[int, ...]]:
    """Every way to take `size` as a product of divisors of the dims left, one per dim."""
    if not left:
        if size == 1:
            yield ()
        return
    rest = math.prod(left[1:])
    for d in reversed(_divisors(math.gcd(left[0], size))):  # whole dims first
        if rest % (size // d) == 0:
            for tail in _columns(left[1:], size // d):
                yield (d, *tail)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
