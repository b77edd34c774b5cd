"""The meshes `choose_mesh` searches (cost/choose/mesh.py): families of axes (`Space`), each one's
shapes (ordered factorisations of the device count) and their ICI/DCN splits, and the checks
of a search's arguments.

A family may fix its leading axes' sizes and DCN factors: the default search's pipelines
(cost/choose/pipeline.py's `dcn_pipelines`) put a pipeline axis of S stages wholly across
granules (ICI factor 1, DCN factor S) ahead of the search's own axes, whose shapes then cover
the N / S devices of a stage over the G / S granules it spans.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import product
from typing import Any

from ...errors import MeshConfigError
from ...workload.layout import PIPELINE_NAMES, ROLE_NAMES, Roles
from .recipes import Recipe, divisors

AXES = ("data", "fsdp", "seq", "model")
# A model with experts: also the expert axis, so that the search weighs an expert degree (tokens
# by all-to-all, each device E / P experts) against experts on fsdp (expert axis 1: every expert
# on each device, its d_model cut over fsdp, gathered; MaxText's default rules).
MOE_AXES = ("data", "fsdp", "expert", "seq", "model")
# The batch axes of a searched mesh: the expert axis is one (it splits the batch as FSDP does
# outside the experts).
BATCH = ("data", "replicate", *ROLE_NAMES["fsdp"], *ROLE_NAMES["expert"])
ACROSS = "tensor or sequence axis across granules"
WHOLE = "sequence axis where whole sequences fit (the batch fills the devices without one)"


@dataclass(frozen=True)
class Space:
    """A family of meshes: its axis names (mesh order), batch axes, and the (size, DCN factor)
    of its leading axes where the family fixes them (the rest are searched)."""

    names: tuple[str, ...]
    batch: tuple[str, ...]
    lead: tuple[tuple[int, int], ...] = ()

    def shapes(self, n: int) -> Iterator[tuple[int, ...]]:
        """Every shape of the family over `n` devices."""
        fixed = tuple(s for s, _ in self.lead)
        rest = n // math.prod(fixed)
        if rest * math.prod(fixed) != n:
            return
        for sizes in factorisations(rest, len(self.names) - len(fixed)):
            yield (*fixed, *sizes)

    def splits(self, sizes: tuple[int, ...], granules: int) -> Iterator[tuple[int, ...]]:
        """Every DCN split of `sizes` over `granules`: each axis's DCN factor divides its size,
        their product is `granules`, the leading axes' as the family fixes them."""
        fixed = tuple(d for _, d in self.lead)
        left = granules // math.prod(fixed)
        if left * math.prod(fixed) != granules:
            return
        for dcn in dcn_splits(sizes[len(fixed) :], left):
            yield (*fixed, *dcn)

    def count(self, sizes: tuple[int, ...], granules: int) -> int:
        """How many DCN splits `sizes` has (what a shape pruned whole counts)."""
        return sum(1 for _ in self.splits(sizes, granules))


@dataclass(frozen=True, eq=False)
class Candidate:
    """A mesh that fits: its family, roles, the ICI and DCN factor of each axis, the recipes
    that fit it with each one's compute floor (cost/choose/search.py's `compute_floor`), and
    three lower bounds of its key on the planner's rings, each above the one before: `floor`
    (unpriced), `split_floor` (each recipe's compute floor plus what its collectives spend
    across granules on this split, `across`) and `bound`, the key of its fastest recipe on
    perfect rings; the last two priced when first read."""

    floor: tuple[bool, float]  # (whether every recipe is beyond the headroom, least floor)
    space: Space
    roles: Roles
    factors: dict[str, tuple[int, int]]  # axis -> (ici, dcn), in mesh order
    recipes: list[Recipe]
    floors: list[float]  # each recipe's compute floor
    across: Callable[[], list[float]] = field(repr=False)  # each recipe's floor on this split
    priced: Callable[[list[float]], tuple[Any, ...]] = field(repr=False)  # the bound, priced

    @cached_property
    def split_floors(self) -> list[float]:
        return self.across()

    @cached_property
    def split_floor(self) -> tuple[bool, float]:
        return (self.floor[0], min(self.split_floors))

    @cached_property
    def bound(self) -> tuple[Any, ...]:
        return self.priced(self.split_floors)

    @property
    def ici(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.factors.values())

    @property
    def dcn(self) -> tuple[int, ...]:
        return tuple(d for _, d in self.factors.values())

    @property
    def staged(self) -> bool:
        """Whether the mesh has a pipeline axis larger than 1."""
        return self.roles.size("pipeline") > 1


def across(names: tuple[str, ...], r: Roles, dcn: tuple[int, ...]) -> bool:
    """Whether a split puts a tensor or sequence axis across granules (pruned: its collectives
    would be exposed over DCN)."""
    return any(d > 1 and a in (r.model, r.seq) for a, d in zip(names, dcn, strict=True))


def check_axes(axes: Sequence[str], top: int) -> tuple[str, ...]:
    """`axes` and `top` as choose_mesh takes them: distinct known names with a batch axis."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise MeshConfigError(f"top={top!r}; accepted: an int >= 1")
    known = {"data", "replicate", *(n for v in ROLE_NAMES.values() for n in v), *PIPELINE_NAMES}
    if (
        not isinstance(axes, list | tuple)
        or not axes
        or any(not isinstance(a, str) or a not in known for a in axes)
    ):
        raise MeshConfigError(
            f"axes={axes!r}; accepted: distinct names from {sorted(known)}, e.g. {AXES}"
        )
    names = tuple(axes)
    if len(set(names)) != len(names):
        raise MeshConfigError(f"axes={axes!r} repeats a name; accepted: distinct names")
    if not any(a in BATCH for a in names):
        raise MeshConfigError(
            f"axes={axes!r} has no batch axis; accepted: axes including 'data' or an FSDP axis "
            f"({', '.join(ROLE_NAMES['fsdp'])})"
        )
    return names


def factorisations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way of writing n as a product of `parts` positive ints."""
    if parts == 0:
        yield from [()] * (n == 1)
        return
    if parts == 1:
        yield (n,)
        return
    for first in divisors(n):
        for rest in factorisations(n // first, parts - 1):
            yield (first, *rest)


def dcn_splits(sizes: tuple[int, ...], granules: int) -> Iterator[tuple[int, ...]]:
    """Every (dcn_0, ...) with dcn_i dividing size_i and product `granules`."""
    choices = [[d for d in divisors(s) if granules % d == 0] for s in sizes]
    for dcn in product(*choices):
        if math.prod(dcn) == granules:
            yield dcn


def tally(counts: dict[str, int], reason: str, k: int) -> None:
    counts[reason] = counts.get(reason, 0) + k
