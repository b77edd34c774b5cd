"""`choose_mesh`: every shape and ICI/DCN split of the axes over the hardware, and every
recipe (remat placement, micro-batches, logits chunks) of the search, estimated; the meshes
that fit ranked by step time, each with its fastest recipe.

Candidates are the ordered factorisations of the device count over the axes that the model
divides (heads, kv heads, d_ff, vocabulary and the residual stream's d_model by the tensor axis;
d_model by FSDP; the sequence by the sequence axis; the global batch by the batch axes), times
every way of spreading the granules (slices, NVLink domains) over them. Pruned, and counted:
tensor or sequence axes across granules (their collectives are exposed, DCN makes them strictly
slower than the same shape with that factor on a batch axis), and pipelines the cost model
does not price (cost/choose_pipeline.py: pipeline micro-batches and repeats are recipe fields).
Memory does not depend on device order, so candidates that do not fit are dropped before
planning; the rest are estimated with perfect rings first, which bounds their real time from
below, and only those whose bound can still reach the top are planned by the real planner and
estimated on its rings. The recipes
each mesh may run are cost/recipes.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import product
from typing import Any

from ..config import MeshConfig
from ..errors import MeshConfigError
from ..hardware.profile import DeviceFacts, hardware_profile
from ..hardware.strings import simulate_devices
from ..plan import MeshPlan, plan_config
from ..shapes import HybridMeshShape
from ..workload.layout import PIPELINE_NAMES, ROLE_NAMES, Roles, check_fit, check_modelled, roles
from ..workload.spec import ModelSpec, TrainSpec
from .choose_pipeline import PRUNED, pipeline_recipes, pipeline_unpriced
from .estimate import Estimate, estimate_parts, holds_tables
from .recipes import (
    MOE_PATHS,
    RECIPE_FIELDS,
    Recipe,
    assumed_host_facts,
    check_recipes,
    divisors,
    fitting_recipes,
    missing_host_facts,
)

AXES = ("data", "fsdp", "seq", "model")
_ACROSS = "tensor or sequence axis across granules"
# A model with experts: also the expert axis, so that the search weighs an expert degree (tokens
# by all-to-all, each device E / P experts) against experts on fsdp (expert axis 1: every expert
# on each device, its d_model cut over fsdp, gathered; MaxText's default rules).
MOE_AXES = ("data", "fsdp", "expert", "seq", "model")
# The batch axes of a searched mesh: the expert axis is one (it splits the batch as FSDP does
# outside the experts).
_BATCH = ("data", "replicate", *ROLE_NAMES["fsdp"], *ROLE_NAMES["expert"])


@dataclass(frozen=True, eq=False)
class Choice:
    """One ranked mesh: its config (a HybridMeshShape over the axes), plan and estimate."""

    config: MeshConfig
    plan: MeshPlan
    estimate: Estimate
    train: TrainSpec  # the recipe chosen with the mesh (the given TrainSpec otherwise)
    # its memory is over the headroom's limit but within the model's measured error of fitting
    beyond_headroom: bool = False

    @property
    def unsure(self) -> bool:
        """Whether the choice rests on an assumption or on the model's error (ranked after
        every choice that does not)."""
        return self.beyond_headroom or bool(self.estimate.assumes)

    @property
    def ici(self) -> tuple[int, ...]:
        return self.plan.ici_mesh_shape

    @property
    def dcn(self) -> tuple[int, ...]:
        return self.plan.dcn_mesh_shape


@dataclass(frozen=True)
class _Candidate:
    """A mesh that fits: its roles, the ICI and DCN factor of each axis, the recipes that fit
    it, and `bound`, the ranking key of its fastest recipe on perfect rings (a lower bound of
    the key on the planner's rings)."""

    bound: tuple[Any, ...]
    roles: Roles
    factors: dict[str, tuple[int, int]]  # axis -> (ici, dcn), in mesh order
    recipes: list[Recipe]

    @property
    def ici(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.factors.values())

    @property
    def dcn(self) -> tuple[int, ...]:
        return tuple(d for _, d in self.factors.values())


@dataclass(frozen=True)
class _Scored:
    """The fastest recipe on a mesh: its ranking key, recipe and estimate."""

    key: tuple[Any, ...]
    train: TrainSpec
    estimate: Estimate
    beyond: bool


class Ranking(list[Choice]):
    """The best choices, best first, and how the search went: `considered` shapes times splits,
    `pruned` (reason -> count), `planned` by the real planner and estimated on its rings,
    `unsearched`: what the catalogue could not price, so the search left it out; `assumed`:
    what it priced on a condition (cost/conditions.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.considered = 0
        self.pruned: dict[str, int] = {}
        self.planned = 0
        self.unsearched: list[str] = []
        self.assumed: list[str] = []  # what the search priced on a condition


def choose_mesh(
    hardware: str,
    model: str | ModelSpec,
    train: TrainSpec,
    *,
    axes: Sequence[str] | None = None,
    top: int = 5,
    headroom: float = 0.1,
    recipes: Iterable[Mapping[str, Any]] | None = None,
    facts: Mapping[str, str | float] | None = None,
) -> Ranking:
    """The `top` fitting meshes of `axes` for `model` on `hardware`, fastest first, each with the
    fastest recipe that fits it.

    A mesh fits when its estimate leaves `headroom` of the HBM (and of the host memory it
    offloads to) free: what the estimate may miss (against the compiler it is within 20%,
    benchmarks/bench_cost.py). Ties in step time go to less communication, then less device
    memory, then the earlier recipe of the search (REMATS order, fewer micro-batches, fewer
    chunks).

    Args:
        hardware: a catalogue hardware string.
        model: a ModelSpec or a name from `configs/models/`.
        train: the batch, dtypes and attention (and the recipe when `recipes` pins it).
        axes: the mesh axes whose shapes and ICI/DCN splits are searched; None (default):
            AXES, and for a model with experts MOE_AXES (with the expert axis).
        top: how many choices to return.
        headroom: the share of memory left free, in [0, 1).
        recipes: narrows the recipe search: mappings from recipe fields (RECIPE_FIELDS) to
            values; a field a mapping leaves out is searched (remat over REMATS, microbatches
            over the divisors of the per-replica batch, logits_chunks over LOGITS_CHUNKS,
            and for a model with experts moe over MOE_PATHS, dropless and capacity, priced as
            the platform runs each; all in cost/recipes.py), so `[{}]` is the whole search
            and `[{"remat": "full", "microbatches": 1, "logits_chunks": 1, "moe":
            "dropless"}]` one recipe (`{"moe": "dropless"}` keeps every token copy). None
            (default): the whole search.
        facts: catalogue facts set for this search (as `estimate`'s `facts`).

    Choices that rest on an assumption (a fact with no source: `Estimate.assumes`) or whose
    memory is over the headroom's limit but within the model's measured error of fitting
    (`Choice.beyond_headroom`, cost/band.py) rank after every choice that does neither.

    Returns:
        A `Ranking` (a list of `Choice`, best first: each its MeshConfig, MeshPlan, Estimate
        and TrainSpec) that also says how many meshes were considered, pruned and planned.

    Raises:
        MeshConfigError: unknown hardware or model, bad `top`, `headroom` or `recipes`, a batch
            no mesh's data-parallel degree divides, or no mesh that fits with any recipe
            searched (the message gives the smallest need).
    """
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    # else each mesh's refusal would read as "fits no mesh"
    check_modelled(model, experts=True, latent=True)
    if axes is None:
        axes = MOE_AXES if model.num_experts else AXES
    names = _check_axes(axes, top)
    if isinstance(headroom, bool) or not isinstance(headroom, float) or not 0 <= headroom < 1:
        raise MeshConfigError(f"headroom={headroom!r}; accepted: a float in [0, 1)")
    wanted = check_recipes(recipes, train)
    if model.num_experts:  # both paths, unless a recipe pins one
        wanted = [w | {"moe": p} for w in wanted for p in ([w["moe"]] if "moe" in w else MOE_PATHS)]
    profile = hardware_profile(hardware, facts)
    spec, device = profile.spec, profile.facts()
    devices = simulate_devices(spec)
    batch = tuple(a for a in names if a in _BATCH)
    n, granules = spec.num_devices, spec.granules
    ranking = Ranking()
    missing = missing_host_facts(device)
    if missing:  # fitting_recipes leaves offload out there
        ranking.unsearched.append(
            f"recipes that offload to host memory (the catalogue has no {' or '.join(missing)} "
            f"for {hardware}; --fact sets it)"
        )
    assumed = assumed_host_facts(device)
    if assumed and not missing:
        ranking.assumed.append(
            f"recipes that offload to host memory rest on the {' and '.join(assumed)} (the "
            f"catalogue has none for {hardware}): each such choice names its condition"
        )
    candidates: list[_Candidate] = []
    # Perfect rings, each over every torus dim of a slice at once: what no planned axis beats
    # (AxisQuality.link_factor), so a bound on every mesh's step
    best_links = dict.fromkeys(names, float(max(1, sum(d > 1 for d in spec.topology))))
    smallest: int | None = None  # the least memory a mesh needs where none fits
    unpriced: list[tuple[Roles, bool]] = []  # meshes whose weights alone do not fit
    fits = f"{1 - headroom:.0%} of memory nor within the model's error of all of it"
    batch_ok = False
    for sizes in _factorisations(n, len(names)):
        r = roles(tuple(zip(names, sizes, strict=True)), batch)
        if pipeline_unpriced(model, r):  # a pipeline the cost model does not price beside these
            splits = _splits(sizes, granules)
            ranking.considered += splits
            _count(ranking.pruned, PRUNED, splits)
            continue
        try:
            check_fit(model, train, r)
        except MeshConfigError:
            batch_ok |= train.global_batch % r.size("batch") == 0
            splits = _splits(sizes, granules)
            ranking.considered += splits
            _count(ranking.pruned, "the model or batch does not divide", splits)
            continue
        batch_ok = True
        # the recipes that fit, and the least memory of those that do not, by whether the
        # split holds the embedding tables for a reduction across granules (memory depends on
        # nothing else of the split)
        fitting: dict[bool, tuple[list[Recipe], int | None]] = {}
        for dcn in _dcn_splits(sizes, granules):
            ranking.considered += 1
            if _across(names, r, dcn):
                _count(ranking.pruned, _ACROSS, 1)
                continue
            ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
            factors = dict(zip(names, zip(ici, dcn, strict=True), strict=True))
            held = holds_tables(device, r, factors)
            if held not in fitting:
                here = pipeline_recipes(wanted, r)
                fitting[held] = fitting_recipes(model, train, here, r, device, held, headroom)
            recipes_here, least = fitting[held]
            if not recipes_here:
                if least is not None:
                    smallest = least if smallest is None else min(smallest, least)
                else:
                    unpriced.append((r, held))
                _count(ranking.pruned, f"no recipe fits in {fits}", 1)
                continue
            bound = _fastest(model, r, factors, best_links, device, recipes_here).key
            candidates.append(_Candidate(bound, r, factors, recipes_here))
    if not batch_ok:
        raise MeshConfigError(
            f"global_batch={train.global_batch} is smaller than, or no multiple of, the "
            f"data-parallel degree of every mesh of {list(names)} over {n} devices; accepted: a "
            "multiple of some batch-axes product"
        )
    if not candidates:
        for r, held in unpriced:  # priced now, for the message's smallest need
            least = fitting_recipes(model, train, wanted, r, device, held, headroom, floor=False)[1]
            if least is not None:
                smallest = least if smallest is None else min(smallest, least)
        needed = "" if smallest is None else f" the smallest needs {smallest / 1e9:.2f} GB"
        raise MeshConfigError(
            f"model {model.name!r} with global batch {train.global_batch} fits no mesh of "
            f"{list(names)} on {hardware} with any recipe searched:{needed} per device, the "
            f"hardware has {device.hbm_bytes / 1e9:.2f} GB (of which the choice leaves "
            f"{headroom:.0%} free)"
        )
    candidates.sort(key=lambda c: c.bound)
    best: list[tuple[tuple[Any, ...], Choice]] = []  # (key on the planner's rings, choice)
    for c in candidates:
        if len(best) >= top and c.bound >= best[top - 1][0]:
            break  # perfect rings would not beat the top: neither will real ones
        config = MeshConfig(HybridMeshShape(c.ici, c.dcn), names, batch)
        plan = plan_config(config, devices, granule="auto", hardware=hardware)
        efficiency = {a: q.link_factor for a, q in plan.quality().items()}
        fastest = _fastest(model, c.roles, c.factors, efficiency, device, c.recipes)
        ranking.planned += 1
        choice = Choice(config, plan, fastest.estimate, fastest.train, fastest.beyond)
        best.append((fastest.key, choice))
        best.sort(key=lambda b: b[0])
    ranking.extend(choice for _, choice in best[:top])
    return ranking


def _across(names: tuple[str, ...], r: Roles, dcn: tuple[int, ...]) -> bool:
    """Whether a split puts a tensor or sequence axis across granules (pruned: its collectives
    would be exposed over DCN)."""
    return any(d > 1 and a in (r.model, r.seq) for a, d in zip(names, dcn, strict=True))


def _fastest(
    model: ModelSpec,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
    recipes: list[Recipe],
) -> _Scored:
    """The fastest of the recipes on this mesh (`efficiency`: each axis's link factor)."""
    sizes = tuple(s for _, s in r.sizes)
    scored = []
    for k, recipe in enumerate(recipes):
        e = estimate_parts(model, recipe.train, r, factors, efficiency, facts, terms=recipe.terms)
        unsure = recipe.beyond or bool(e.assumes)
        scored.append(_Scored((unsure, *_key(e), k, sizes), recipe.train, e, recipe.beyond))
    return min(scored, key=lambda s: s.key)


def auto_preset(
    *,
    hardware: str | None = None,
    model: str | ModelSpec | None = None,
    global_batch: int | None = None,
    **train: Any,
) -> MeshConfig:
    """`MeshConfig.from_preset("auto", ...)`: the winner of `choose_mesh` (its mesh; recipe
    fields given here narrow the search as `recipes=` does)."""
    axes = train.pop("axes", None)
    if hardware is None or model is None or global_batch is None:
        raise MeshConfigError(
            f"preset 'auto' needs hardware=, model= and global_batch= (given hardware={hardware!r},"
            f" model={model!r}, global_batch={global_batch!r}); accepted: e.g. "
            "from_preset('auto', hardware='tpu-v5p-512', model='llama3-8b', global_batch=256)"
        )
    options = [f.name for f in fields(TrainSpec) if f.name != "global_batch"]
    unknown = sorted(set(train) - set(options))
    if unknown:
        raise MeshConfigError(
            f"preset 'auto': unknown option {unknown[0]}={train[unknown[0]]!r}; accepted: "
            f"hardware, model, global_batch, axes, {', '.join(options)}"
        )
    fixed = {k: train[k] for k in RECIPE_FIELDS if k in train}
    spec = TrainSpec(global_batch=global_batch, **train)
    return choose_mesh(hardware, model, spec, axes=axes, recipes=[fixed])[0].config


def _key(e: Estimate) -> tuple[float, float, int]:
    """Fastest first; among equals, the one that communicates least, then the smallest (the
    caller adds the recipe's place in the search and the mesh). With perfect rings each part is
    a lower bound of the planned one, so the key is one too."""
    return (e.step_seconds, sum(a.seconds for a in e.axes.values()), e.memory_bytes)


def _check_axes(axes: Sequence[str], top: int) -> tuple[str, ...]:
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
    if not any(a in _BATCH for a in names):
        raise MeshConfigError(
            f"axes={axes!r} has no batch axis; accepted: axes including 'data' or an FSDP axis "
            f"({', '.join(ROLE_NAMES['fsdp'])})"
        )
    return names


def _factorisations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way of writing n as a product of `parts` positive ints."""
    if parts == 1:
        yield (n,)
        return
    for first in divisors(n):
        for rest in _factorisations(n // first, parts - 1):
            yield (first, *rest)


def _dcn_splits(sizes: tuple[int, ...], granules: int) -> Iterator[tuple[int, ...]]:
    """Every (dcn_0, ...) with dcn_i dividing size_i and product `granules`."""
    choices = [[d for d in divisors(s) if granules % d == 0] for s in sizes]
    for dcn in product(*choices):
        if math.prod(dcn) == granules:
            yield dcn


def _splits(sizes: tuple[int, ...], granules: int) -> int:
    return sum(1 for _ in _dcn_splits(sizes, granules))


def _count(counts: dict[str, int], reason: str, k: int) -> None:
    counts[reason] = counts.get(reason, 0) + k
