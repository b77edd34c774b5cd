"""The candidates of `choose_mesh`'s search (cost/choose/mesh.py), mesh by mesh: a shape's roles
checked, its ICI/DCN splits, the recipes that fit each (cost/choose/recipes.py) and the ranking key
of the fastest on perfect rings (a bound on its key on the planner's rings); what it prunes,
counted; and where nothing fits, the error that says why (the batch, where a larger one lets a mesh
fit)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, get_args

from ...errors import MeshConfigError
from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles, check_fit, roles
from ...workload.spec import ContextStrategy, ModelSpec, TrainSpec
from ...workload.stages import dividing_layers
from ..calibration import Calibrated
from ..estimate import Estimate, Priced, across_granules, holds_tables, price
from ..step import step_cost
from ..timing.axes import across_seconds
from .pipeline import pipeline_recipes
from .recipes import Recipe, fitting_recipes
from .space import ACROSS, WHOLE, Candidate, Space, across, tally


@dataclass(frozen=True)
class Scored:
    """The fastest recipe on a mesh: its ranking key, recipe and estimate."""

    key: tuple[Any, ...]
    train: TrainSpec
    estimate: Estimate
    beyond: bool


class Search:
    """The candidates of a search, mesh by mesh, and what it pruned (counted on `ranking`)."""

    def __init__(
        self,
        model: ModelSpec,
        train: TrainSpec,
        wanted: list[dict[str, Any]],
        device: DeviceFacts,
        headroom: float,
        granules: int,
        link: float,
    ) -> None:
        self.model, self.train, self.wanted, self.device = model, train, wanted, device
        self.headroom, self.granules, self.link = headroom, granules, link
        self.considered = 0  # shapes times splits
        self.pruned: dict[str, int] = {}  # reason -> count
        self.batch_ok = False  # whether some mesh's data-parallel degree divides the batch
        self.smallest: int | None = None  # the least memory a mesh needs where none fits
        self.unpriced: list[tuple[Roles, bool]] = []  # meshes whose weights alone do not fit
        self.fits = f"{1 - headroom:.0%} of memory nor within the model's error of all of it"
        # (roles, tables held, train) -> fitting_recipes's answer: the folded meshes of
        # `_whole_sequences_fit` are meshes of the search too
        self._fitting: dict[tuple[Roles, bool, TrainSpec], tuple[list[Recipe], int | None]] = {}

    def mesh(self, space: Space, sizes: tuple[int, ...]) -> list[Candidate]:
        """The splits of one shape that fit with some recipe, each with its bound."""
        r = roles(tuple(zip(space.names, sizes, strict=True)), space.batch)
        model, train = self.model, for_mesh(self.model, self.train, r)
        try:
            check_fit(model, train, r)
        except MeshConfigError:
            self.batch_ok |= train.global_batch % degree(r) == 0
            self._prune(space, sizes, "the model or batch does not divide")
            return []
        self.batch_ok = True
        if r.size("seq") > 1 and self._whole_sequences_fit(space, sizes):
            self._prune(space, sizes, WHOLE)
            return []
        links = dict.fromkeys(space.names, self.link)
        # the recipes that fit, and the least memory of those that do not, by whether the
        # split holds the embedding tables for a reduction across granules (memory depends on
        # nothing else of the split)
        fitting: dict[bool, tuple[list[Recipe], int | None, list[float]]] = {}
        out = []
        for dcn in space.splits(sizes, self.granules):
            self.considered += 1
            if across(space.names, r, dcn):
                tally(self.pruned, ACROSS, 1)
                continue
            ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
            factors = dict(zip(space.names, zip(ici, dcn, strict=True), strict=True))
            held = holds_tables(self.device, r, factors)
            if held not in fitting:
                found, low = self._recipes(train, r, held)
                fitting[held] = found, low, self._floors(r, found)
            recipes_here, least, floors = fitting[held]
            if not recipes_here:
                if least is not None:
                    self.smallest = least if self.smallest is None else min(self.smallest, least)
                else:
                    self.unpriced.append((r, held))
                tally(self.pruned, f"no recipe fits in {self.fits}", 1)
                continue
            lowest = (all(x.beyond for x in recipes_here), min(floors))
            split = partial(self._split_floors, r, factors, recipes_here, floors)
            bound = partial(self._bound, r, factors, links, recipes_here)
            out.append(Candidate(lowest, space, r, factors, recipes_here, floors, split, bound))
        return out

    def _floors(self, r: Roles, recipes: list[Recipe]) -> list[float]:
        """Each recipe's compute floor on this mesh (`compute_floor`: none depends on the
        split)."""
        calibrated = Calibrated.of(self.device.platform)
        return [compute_floor(self.model, x, r, self.device, calibrated) for x in recipes]

    def _split_floors(
        self,
        r: Roles,
        factors: dict[str, tuple[int, int]],
        recipes: list[Recipe],
        floors: list[float],
    ) -> list[float]:
        """Each recipe's compute floor plus the seconds its collectives spend across granules
        on this split (`split_floor`)."""
        calibrated, traits = Calibrated.of(self.device.platform), self.device.traits
        dcn = across_granules(self.device, factors, calibrated.dcn_latency,
                              calibrated.slice_bandwidth)  # fmt: skip
        out = []
        for recipe, floor in zip(recipes, floors, strict=True):
            step = step_cost(self.model, recipe.train, r)
            found = step.collectives(
                overlapped=traits.overlaps_tensor_collectives,
                regather=traits.regathers_attention_weights,
            )
            skip = None if step.pipeline is None else step.pipeline.axis
            # below the step's sum of the same seconds by more than its rounding
            out.append(floor + across_seconds(found, factors, dcn, skip=skip) * (1 - 1e-9))
        return out

    def _bound(
        self,
        r: Roles,
        factors: dict[str, tuple[int, int]],
        links: dict[str, float],
        recipes: list[Recipe],
        floors: list[float],
    ) -> tuple[Any, ...]:
        """A mesh's bound: the key of its fastest recipe on perfect rings (`links`)."""
        return fastest(self.model, r, factors, links, self.device, recipes, floors).key

    def _recipes(self, train: TrainSpec, r: Roles, held: bool) -> tuple[list[Recipe], int | None]:
        """The recipes that fit the mesh and the least memory of those that do not; on a mesh
        with a sequence axis, under each context strategy (all-gather and ring differ in what
        they hold and what they hide)."""
        here = pipeline_recipes(self.wanted, r)
        strategies: tuple[ContextStrategy, ...] = (
            get_args(ContextStrategy) if r.size("seq") > 1 else (train.context_strategy,)
        )
        found: list[Recipe] = []
        least: int | None = None
        for strategy in strategies:
            t = replace(train, context_strategy=strategy)
            more, low = self._fitting_recipes(t, here, r, held)
            found += more
            if low is not None:
                least = low if least is None else min(least, low)
        return found, least

    def _whole_sequences_fit(self, space: Space, sizes: tuple[int, ...]) -> bool:
        """Whether the mesh with its sequence axis folded into its FSDP axis (else its first
        batch axis: each device whole sequences, the weights cut as often) takes the batch and
        fits with some recipe: then a sequence axis only adds its key and value traffic, and
        the search leaves it out (`WHOLE`)."""
        here = roles(tuple(zip(space.names, sizes, strict=True)), space.batch)
        seq = space.names.index(str(here.seq))
        batch = [k for k, a in enumerate(space.names) if a in space.batch]
        into = space.names.index(here.fsdp) if here.fsdp in space.batch else batch[0]
        folded = list(sizes)
        folded[into], folded[seq] = folded[into] * folded[seq], 1
        r = roles(tuple(zip(space.names, folded, strict=True)), space.batch)
        train = for_mesh(self.model, self.train, r)
        try:
            check_fit(self.model, train, r)
        except MeshConfigError:
            return False
        return bool(self._fitting_recipes(train, pipeline_recipes(self.wanted, r), r, False)[0])

    def _fitting_recipes(
        self, train: TrainSpec, wanted: list[dict[str, Any]], r: Roles, held: bool
    ) -> tuple[list[Recipe], int | None]:
        """`fitting_recipes` on this mesh, found once a search (`wanted` is the search's on
        `r`, `pipeline_recipes`)."""
        key = (r, held, train)
        if key not in self._fitting:
            self._fitting[key] = fitting_recipes(
                self.model, train, wanted, r, self.device, held, self.headroom
            )
        return self._fitting[key]

    def _prune(self, space: Space, sizes: tuple[int, ...], reason: str) -> None:
        k = space.count(sizes, self.granules)
        self.considered += k
        tally(self.pruned, reason, k)

    def no_fit(self, spaces: list[Space], n: int, hardware: str) -> MeshConfigError:
        """The error where no mesh fits: the batch named where a larger one would let a mesh
        fit (`larger_batch`), else the smallest need against the hardware's memory."""
        model, train, device = self.model, self.train, self.device
        for r, held in self.unpriced:  # priced now, for the message's smallest need
            least = fitting_recipes(
                model,
                for_mesh(model, train, r),
                self.wanted,
                r,
                device,
                held,
                self.headroom,
                floor=False,
            )[1]
            if least is not None:
                self.smallest = least if self.smallest is None else min(self.smallest, least)
        names = list(spaces[0].names)
        least = self.smallest
        needed = "" if least is None else f" the smallest needs {least / 1e9:.2f} GB"
        larger = larger_batch(self, spaces, n)
        if larger is not None:
            batch, c = larger
            shape = " x ".join(f"{a}={k}" for a, k in c.roles.sizes if k > 1)
            crossing = self.pruned.get(ACROSS, 0)
            why = [f"{crossing} put a tensor or sequence axis across granules"] * bool(crossing)
            if least is not None:
                why.append(f"the least memory a device needs is {least / 1e9:.2f} GB")
            elif any(k.startswith("no recipe fits") for k in self.pruned):
                why.append("the others need more memory than a device has")
            return MeshConfigError(
                f"global_batch={train.global_batch} is too small for model {model.name!r} on "
                f"{hardware}: no mesh of {names} whose data-parallel degree divides it fits "
                f"with any recipe searched ({'; '.join(why)}; the hardware has "
                f"{device.hbm_bytes / 1e9:.2f} GB, of which the choice leaves {self.headroom:.0%}"
                f" free); accepted: a batch that a larger data-parallel degree divides, e.g. "
                f"global_batch={batch} (the smallest multiple of {train.global_batch} at which a "
                f"mesh fits: {shape})"
            )
        return MeshConfigError(
            f"model {model.name!r} with global batch {train.global_batch} fits no mesh of "
            f"{names} on {hardware} with any recipe searched:{needed} per device, the "
            f"hardware has {device.hbm_bytes / 1e9:.2f} GB (of which the choice leaves "
            f"{self.headroom:.0%} free)"
        )


def degree(r: Roles) -> int:
    """What the global batch must divide by on these roles: the batch axes, and outside the
    pipelined layers the pipeline axis too."""
    return r.size("batch") * r.size("pipeline")


def fastest(
    model: ModelSpec,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
    recipes: list[Recipe],
    floors: list[float] | None = None,
) -> Scored:
    """The fastest of the recipes on this mesh (`efficiency`: each axis's link factor). A
    recipe beyond the headroom is unsure and ranks after every sure one, so those are
    priced only where no recipe within it is sure. Each recipe is priced (`price`), the
    winner alone written out as an Estimate. Recipes are priced by their compute first
    (`floors`: each one's `compute_floor`, a lower bound on its step; None: found here), and
    one whose floor is slower than the best priced so far (and no surer) is not priced: it
    cannot win."""
    sizes = tuple(s for _, s in r.sizes)
    calibrated = Calibrated.of(facts.platform)
    dcn = across_granules(facts, factors, calibrated.dcn_latency, calibrated.slice_bandwidth)
    if floors is None:
        floors = [compute_floor(model, recipe, r, facts, calibrated) for recipe in recipes]
    order = sorted(range(len(recipes)), key=floors.__getitem__)
    scored: list[tuple[tuple[Any, ...], Recipe, Priced]] = []
    lead: tuple[Any, ...] | None = None  # the best key so far
    for beyond in (False, True):
        if beyond and any(not s[0][0] for s in scored):
            break
        for k in order:
            recipe = recipes[k]
            if recipe.beyond != beyond or (lead and (beyond, floors[k]) > lead[:2]):
                continue
            p = price(model, recipe.train, r, factors, efficiency, facts, calibrated,
                      terms=recipe.terms, dcn=dcn)  # fmt: skip
            assert p.time.seconds >= floors[k], "the recipe's floor is no lower bound"
            unsure = recipe.beyond or bool(p.assumes)
            scored.append(((unsure, *key(p, recipe.peak), k, sizes), recipe, p))
            lead = min(lead or scored[-1][0], scored[-1][0])
    best, recipe, p = min(scored, key=lambda s: s[0])
    return Scored(best, recipe.train, p.estimate(), recipe.beyond)


def compute_floor(
    model: ModelSpec, recipe: Recipe, r: Roles, facts: DeviceFacts, calibrated: Calibrated
) -> float:
    """The recipe's compute seconds on this mesh: its step with no collective and no offload.
    A lower bound on its step on any rings: the step is max(compute, hidden) + exposed +
    across granules + offload (timing/step.py), each a sum of non-negative seconds, and
    rounding is monotone, so the float sum is never below the compute."""
    step = step_cost(model, recipe.train, r)
    kept = recipe.terms["activations"]
    return step.time(facts, (0.0, 0.0, 0.0), calibrated, offload_bytes=0.0, kept_bytes=kept).seconds


def key(p: Priced, peak: int) -> tuple[float, float, int]:
    """Fastest first; among equals, the one that communicates least, then the smallest (`peak`:
    its memory terms' peak, as `Priced.memory_bytes`; the caller adds the recipe's place in the
    search and the mesh). With perfect rings each part is a lower bound of the planned one, so
    the key is one too."""
    return (p.time.seconds, sum(a.seconds for a in p.axes.values()), peak)


def for_mesh(model: ModelSpec, train: TrainSpec, r: Roles) -> TrainSpec:
    """`train` as the search prices it on a mesh: ZeRO-1 (`optimizer_over_data`) dropped
    where the mesh has no data-parallel axis to cut the optimizer over (there it is sharded
    as the parameters are, which is all ZeRO-1 asks); beside a pipeline whose stages do not
    divide the model's layers, and no `pipeline_layers` given, the most last layers they
    divide (workload/stages.py `dividing_layers`; 405B's 126 over 8 stages: 120; where that
    leaves more than a stage's share before the pipeline, the stages are not searched)."""
    if train.optimizer_over_data and not r.data_parallel_axes():
        train = replace(train, optimizer_over_data=False)
    stages = r.size("pipeline")
    if stages > 1 and not train.pipeline_layers:
        layers = dividing_layers(model, stages)
        if layers not in (0, model.num_layers):
            train = replace(train, pipeline_layers=layers)
    return train


def larger_batch(search: Search, spaces: list[Space], n: int) -> tuple[int, Candidate] | None:
    """Where the global batch refused a mesh for its data-parallel degree (`degree`): the
    smallest multiple of the batch at which one such mesh fits, and that mesh; None if none
    does. A larger batch asks no more memory of a device (its micro-batches are searched)."""
    model, train = search.model, search.train
    waiting: dict[int, list[tuple[Space, tuple[int, ...]]]] = {}  # batch -> meshes it admits
    for space in spaces:
        for sizes in space.shapes(n):
            r = roles(tuple(zip(space.names, sizes, strict=True)), space.batch)
            need = math.lcm(train.global_batch, degree(r))
            if need == train.global_batch:
                continue
            try:
                check_fit(model, replace(for_mesh(model, train, r), global_batch=need), r)
            except MeshConfigError:
                continue
            waiting.setdefault(need, []).append((space, sizes))
    for need in sorted(waiting):
        at = Search(model, replace(train, global_batch=need), search.wanted, search.device,
                    search.headroom, search.granules, search.link)  # fmt: skip
        for space, sizes in waiting[need]:
            found = at.mesh(space, sizes)
            if found:
                return need, found[0]
    return None
