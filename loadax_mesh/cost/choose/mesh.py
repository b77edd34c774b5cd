"""`choose_mesh`: every shape and ICI/DCN split of the axes over the hardware, and every
recipe (remat placement, micro-batches, logits chunks) of the search, estimated; the meshes
that fit ranked by step time, each with its fastest recipe.

Candidates are the ordered factorisations of the device count over the axes that the model
divides (heads, kv heads, d_ff, vocabulary and the residual stream's d_model by the tensor axis;
d_model by FSDP; the sequence by the sequence axis; the global batch by the batch axes), times
every way of spreading the granules (slices, NVLink domains) over them; by default, on several
granules, the same again behind a pipeline axis wholly across granules (S stages of G / S
granules each: cost/choose/pipeline.py's `dcn_pipelines`; the shapes and splits are
cost/choose/space.py's, each mesh's candidates cost/choose/search.py's). Pruned, and counted:
tensor or sequence axes across granules (their collectives are exposed, DCN makes them strictly
slower than the same shape with that factor on a batch axis), and pipelines the cost model
does not price (cost/choose/pipeline.py: pipeline micro-batches and repeats are recipe fields).
Memory does not depend on device order, so candidates that do not fit are dropped before
planning; the rest are estimated with perfect rings first (after two cheaper floors:
`Candidate`), which bounds their real time from below, and only those whose bound can still
reach the top are planned by the real planner and estimated on its rings. The recipes each
mesh may run are cost/choose/recipes.py's. Where the search found meshes with a pipeline and
without, the fastest of each is kept on the ranking (planned if not ranked), so that its text
can say what the pipeline costs and saves.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ...config import MeshConfig
from ...errors import MeshConfigError
from ...hardware.profile import DeviceFacts, hardware_profile
from ...hardware.strings import simulate_devices
from ...plan import MeshPlan, plan_config
from ...shapes import HybridMeshShape
from ...workload.layout import check_modelled
from ...workload.spec import QUANTIZATION, ModelSpec, TrainSpec
from ..conditions import assumed_host_facts, missing_host_facts
from ..estimate import Estimate, estimate
from .pipeline import dcn_pipelines
from .recipes import (
    MOE_PATHS,
    RECIPE_FIELDS,
    check_recipes,
)
from .search import Search, fastest
from .space import AXES, BATCH, MOE_AXES, Candidate, Space, check_axes

__all__ = ["AXES", "MOE_AXES", "Choice", "Ranking", "auto_preset", "choose_mesh"]


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
        # the default search's pipeline degrees, each wholly across granules (none: no pipeline
        # searched by default, or `axes` given)
        self.stages: tuple[int, ...] = ()
        # where the search found meshes with a pipeline and without: the fastest of each
        # (ranked or not), so that the ranking can say what the pipeline costs and saves
        self.with_pipeline: Choice | None = None
        self.without_pipeline: Choice | None = None
        self.device: DeviceFacts | None = None  # the facts the search priced with
        # the winner's mesh and recipe with the numerics the user did not choose (the other MoE
        # path, another precision the chip has a peak for): (what, its step seconds)
        self.numerics: list[tuple[str, float]] = []
        # where `with_pipeline` runs 1F1B: its peak memory and GPipe's at the same recipe
        self.schedule_saves: tuple[int, int] | None = None

    def __str__(self) -> str:
        """The ranking as text, as `loadax-mesh plan --strategy auto` prints it."""
        from ...view.estimate import ranking_text  # the view stands above: imported when asked

        return ranking_text(self)


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
            AXES, and for a model with experts MOE_AXES (with the expert axis); on hardware
            of several granules also those axes behind a `pipeline` axis of S stages wholly
            across granules, for every S > 1 dividing the granules and the pipelined layers
            (`Ranking.stages`).
        top: how many choices to return.
        headroom: the share of memory left free, in [0, 1).
        recipes: narrows the recipe search: mappings from recipe fields (RECIPE_FIELDS) to
            values; a field a mapping leaves out is searched (remat over REMATS, microbatches
            over the divisors of the per-replica batch, logits_chunks over LOGITS_CHUNKS,
            all in cost/choose/recipes.py), so `[{}]` is the whole search and `[{"remat":
            "full", "microbatches": 1, "logits_chunks": 1}]` one recipe. Numerics stay the
            user's: the MoE path is `train.moe` unless a mapping names one (`[{"moe":
            "dropless"}, {"moe": "capacity"}]` searches both), and `train.quantization` is
            never changed; `Ranking.numerics` says what the others would give on the winner's
            mesh. None (default): the whole search.
        facts: catalogue facts set for this search (as `estimate`'s `facts`).

    Choices that rest on an assumption (a fact with no source: `Estimate.assumes`) or whose
    memory is over the headroom's limit but within the model's measured error of fitting
    (`Choice.beyond_headroom`, cost/band.py) rank after every choice that does neither.

    Returns:
        A `Ranking` (a list of `Choice`, best first: each its MeshConfig, MeshPlan, Estimate
        and TrainSpec) that also says how many meshes were considered, pruned and planned.

    Raises:
        MeshConfigError: unknown hardware or model, bad `top`, `headroom` or `recipes`, a batch
            no mesh's data-parallel degree divides, a batch too small for every mesh that fits
            (the message names global_batch and the smallest multiple of it some mesh fits
            at), or no mesh that fits with any recipe searched (the message gives the smallest
            need).
    """
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    default = axes is None
    names, wanted = _search_options(model, train, axes, top, headroom, recipes)
    profile = hardware_profile(hardware, facts)
    spec, device = profile.spec, profile.facts()
    ranking = Ranking()
    ranking.device = device
    _host_notes(ranking, device, hardware)
    spaces = [Space(names, tuple(a for a in names if a in BATCH))]
    if default:  # and pipelines across granules (docs/design.md section 12: over DCN first)
        spaces += dcn_pipelines(spaces[0], spec.granules, model, train)
        ranking.stages = tuple(s.lead[0][0] for s in spaces[1:])
    # Perfect rings, each over every torus dim of a slice at once: what no planned axis beats
    # (AxisQuality.link_factor), so a bound on every mesh's step
    link = float(max(1, sum(d > 1 for d in spec.topology)))
    search = Search(model, train, wanted, device, headroom, spec.granules, link)
    candidates = _candidates(search, spaces, spec.num_devices, hardware, ranking)
    planner = Planner(model, hardware, device, simulate_devices(spec), ranking)
    ranking.extend(planner.best(candidates, top))
    _pipeline_pair(ranking, candidates, planner)
    ranking.numerics = _other_numerics(ranking[0], model, wanted, facts)
    ranking.schedule_saves = _schedule_saves(ranking.with_pipeline, model, facts)
    return ranking


def _schedule_saves(
    staged: Choice | None, model: ModelSpec, facts: Mapping[str, str | float] | None
) -> tuple[int, int] | None:
    """Where the fastest pipelined mesh runs 1F1B: its peak memory and GPipe's at the same
    recipe (what the schedule saves; its step is GPipe's with the head's sums over the
    pipeline axis: cost/pipeline/traffic.py `_head`)."""
    if staged is None or staged.train.pipeline_schedule != "1f1b":
        return None
    gpipe = replace(staged.train, pipeline_schedule="gpipe")
    return staged.estimate.memory_bytes, estimate(
        staged.plan, model, gpipe, facts=facts
    ).memory_bytes


def _other_numerics(
    best: Choice,
    model: ModelSpec,
    wanted: list[dict[str, Any]],
    facts: Mapping[str, str | float] | None,
) -> list[tuple[str, float]]:
    """The winner's mesh and recipe priced with the numerics the search kept fixed: the MoE
    path it did not search and each precision other than the user's; one that does not fit
    there, or that the chip has no peak for, is left out."""
    t = best.train
    others: list[tuple[str, dict[str, Any]]] = []
    if model.num_experts and len({w["moe"] for w in wanted}) == 1:
        other = next(p for p in MOE_PATHS if p != t.moe)
        others.append((f"moe {other}", {"moe": other}))
    others += [
        (f"quantization {q}", {"quantization": q}) for q in QUANTIZATION if q != t.quantization
    ]
    found = []
    for what, change in others:
        try:
            e = estimate(best.plan, model, replace(t, **change), facts=facts)
        except MeshConfigError:  # a precision the chip has no peak for, a path not built there
            continue
        if e.fits:
            found.append((what, e.step_seconds))
    return found


def _search_options(
    model: ModelSpec,
    train: TrainSpec,
    axes: Sequence[str] | None,
    top: int,
    headroom: float,
    recipes: Iterable[Mapping[str, Any]] | None,
) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """`choose_mesh`'s arguments checked: the axes it searches (AXES, or MOE_AXES for a model
    with experts, where `axes` is None) and the recipes it tries (for a model with experts
    the user's MoE path, `train.moe`, unless a recipe names one: which tokens train is the
    user's call, so both paths are searched only where `recipes` names both)."""
    # else each mesh's refusal would read as "fits no mesh"
    check_modelled(model, experts=True, latent=True)
    if axes is None:
        axes = MOE_AXES if model.num_experts else AXES
    names = check_axes(axes, top)
    if isinstance(headroom, bool) or not isinstance(headroom, float) or not 0 <= headroom < 1:
        raise MeshConfigError(f"headroom={headroom!r}; accepted: a float in [0, 1)")
    wanted = check_recipes(recipes, train)
    if model.num_experts:
        wanted = [w if "moe" in w else w | {"moe": train.moe} for w in wanted]
    return names, wanted


def _host_notes(ranking: Ranking, device: DeviceFacts, hardware: str) -> None:
    """What the ranking says of recipes that offload to host memory: left out where the
    catalogue cannot price them, priced on a condition where it lacks a host fact."""
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


def _candidates(
    search: Search, spaces: list[Space], n: int, hardware: str, ranking: Ranking
) -> list[Candidate]:
    """Every mesh of `spaces` over `n` devices that fits with some recipe, in the search's
    order, its bound not yet priced (what was considered and pruned counted on `ranking`); an
    error where no mesh's data-parallel degree divides the batch, or where none fits."""
    candidates = [c for s in spaces for sizes in s.shapes(n) for c in search.mesh(s, sizes)]
    ranking.considered, ranking.pruned = search.considered, search.pruned
    if not search.batch_ok:
        raise MeshConfigError(
            f"global_batch={search.train.global_batch} is smaller than, or no multiple of, the "
            f"data-parallel degree of every mesh of {list(spaces[0].names)} over {n} devices; "
            "accepted: a multiple of some batch-axes product"
        )
    if not candidates:
        raise search.no_fit(spaces, n, hardware)
    return candidates


class Planner:
    """Candidates planned by the real planner and estimated on its rings, each at most once
    (the ranking and the fastest with or without a pipeline may ask for the same one),
    counted on the ranking as `planned`."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: str,
        device: DeviceFacts,
        devices: Sequence[Any],
        ranking: Ranking,
    ) -> None:
        self.model, self.hardware, self.device = model, hardware, device
        self.devices, self.ranking = devices, ranking
        # id(candidate) -> (its ranking key on the planner's rings, its choice)
        self._done: dict[int, tuple[tuple[Any, ...], Choice]] = {}

    def choice(self, c: Candidate) -> tuple[tuple[Any, ...], Choice]:
        """The candidate planned, with its fastest recipe on the planner's rings."""
        if id(c) not in self._done:
            config = MeshConfig(HybridMeshShape(c.ici, c.dcn), c.space.names, c.space.batch)
            plan = plan_config(config, self.devices, granule="auto", hardware=self.hardware)
            efficiency = {a: q.link_factor for a, q in plan.quality().items()}
            best = fastest(
                self.model, c.roles, c.factors, efficiency, self.device, c.recipes, c.split_floors
            )
            self.ranking.planned += 1
            choice = Choice(config, plan, best.estimate, best.train, best.beyond)
            self._done[id(c)] = (best.key, choice)
        return self._done[id(c)]

    def best(self, group: list[Candidate], k: int) -> list[Choice]:
        """The `k` best of `group` on the planner's rings: planned in order of bound (ties in
        `group`'s order) until the next one's bound does not beat the k-th (perfect rings
        would not beat it: neither will real ones). Each bound is priced only when the one
        below it comes first (`Candidate`: floor, split floor, bound): candidates wait in a
        heap under each in turn, so they leave it in order of bound."""
        best: list[tuple[tuple[Any, ...], Choice]] = []
        heap: list[tuple[tuple[Any, ...], int, int]] = [
            (c.floor, 0, i) for i, c in enumerate(group)
        ]
        heapq.heapify(heap)
        while heap:
            at, tier, i = heapq.heappop(heap)
            if len(best) >= k and at >= best[k - 1][0]:
                break  # what is left is at least `at`
            if tier < 2:
                c = group[i]
                heapq.heappush(heap, (c.split_floor if tier == 0 else c.bound, tier + 1, i))
                continue
            best.append(self.choice(group[i]))
            best.sort(key=lambda b: b[0])
        return [choice for _, choice in best[:k]]


def _pipeline_pair(ranking: Ranking, candidates: list[Candidate], planner: Planner) -> None:
    """Where the search had meshes with a pipeline and without: the fastest of each kept on
    the ranking (`with_pipeline`, `without_pipeline`; planned where not ranked), so that its
    text can say what the pipeline costs and saves."""
    kinds = {k: [c for c in candidates if c.staged == k] for k in (True, False)}
    if not all(kinds.values()):
        return
    for staged, group in kinds.items():
        ranked = [c for c in ranking if (c.estimate.pipeline is not None) == staged]
        found = ranked[0] if ranked else planner.best(group, 1)[0]
        if staged:
            ranking.with_pipeline = found
        else:
            ranking.without_pipeline = found


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
