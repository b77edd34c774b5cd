"""The recipe search of `choose_mesh`: per mesh, every remat placement, micro-batch count,
logits-chunk count and (a model with experts) MoE path that fits.

Per mesh, for each remat placement and logits-chunk count (`recipe_space`), only the fewest
micro-batches that fit are timed (more only add weight gathers, never speed). Memory is checked
before time, so a recipe that does not fit is never timed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

from ...errors import MeshConfigError
from ...hardware.profile import DeviceFacts
from ...workload.layout import Roles, check_fit
from ...workload.spec import MOE, ModelSpec, MoePath, PipelineSchedule, TrainSpec
from ..band import memory_band
from ..conditions import missing_host_facts
from ..memory.terms import TERMS, host_bytes, memory_floor, memory_terms, phases
from ..pipeline.memory import pipeline_memory_floor, pipeline_memory_terms
from ..pipeline.stages import stages_on

# The recipe fields a search varies, and the default search. MaxText's custom offload as the
# tpu-recipes' LLaMA 3.1 8B runs set it: the layer input, q, k, v and the output projection in
# host memory (docs/facts/production_runs.md); as its DeepSeek-V3 run sets it, the layer input
# and the output projection (docs/facts/moe_runs.md, M11: latent attention's q, k and v are too
# wide to offload).
RECIPE_FIELDS = (
    "remat", "microbatches", "logits_chunks", "moe", "pipeline_microbatches", "pipeline_repeats",
    "pipeline_schedule",
)  # fmt: skip
# The pipeline's fields, searched only on a mesh whose pipeline axis is larger than 1
# (cost/choose/pipeline.py)
PIPELINE_FIELDS = ("pipeline_microbatches", "pipeline_repeats", "pipeline_schedule")
# A MoE model's two paths (TrainSpec.moe): every token copy computed, or at most
# capacity_factor x the even share per expert (the rest dropped)
MOE_PATHS = MOE
MAXTEXT_OFFLOAD = {t: "offload" for t in ("layer_input", "query", "key", "value", "out_proj")}
MAXTEXT_MOE_OFFLOAD = {t: "offload" for t in ("layer_input", "out_proj")}
REMATS: tuple[str | dict[str, str], ...] = (
    "none", "dots_attention", "dots", "full", "offload", MAXTEXT_OFFLOAD, MAXTEXT_MOE_OFFLOAD,
)  # fmt: skip
LOGITS_CHUNKS = (1, 4, 16)
Remat = str | tuple[tuple[str, str], ...]  # a remat as TrainSpec takes it, hashable
Pipe = tuple[int, int, PipelineSchedule]  # a pipeline's (micro-batches, repeats, schedule)


@dataclass(frozen=True)
class Recipe:
    """A recipe that fits a mesh, with its memory terms (they do not depend on device order)."""

    train: TrainSpec
    terms: dict[str, int]
    peak: int  # their peak (memory/terms.py's `phases`)
    # over the headroom's limit, but not beyond what the model's measured error allows
    # (cost/band.py): kept, marked, ranked after the recipes within the limit
    beyond: bool = False


def recipe_space(
    train: TrainSpec, rows: int, wanted: list[dict[str, Any]]
) -> Iterator[tuple[MoePath, Remat, int, list[int], Pipe, bool]]:
    """The recipes to try for a mesh whose replicas each hold `rows` sequences: per MoE path,
    remat and chunk count (the search's order), the micro-batch counts in increasing order
    (the caller keeps the fewest that fit), the pipeline's (micro-batches, repeats, schedule)
    as the recipe pins them (the train's otherwise), and whether the schedule is free to search
    (GPipe neither pinned nor the train's 1F1B). Each remat as a hashable value: a policy
    name, or its (tensor, placement) pairs."""
    for fixed in wanted:
        remats = [fixed["remat"]] if "remat" in fixed else list(REMATS)
        chunks = [fixed["logits_chunks"]] if "logits_chunks" in fixed else list(LOGITS_CHUNKS)
        micro = [fixed["microbatches"]] if "microbatches" in fixed else divisors(rows)
        for remat in remats:
            for c in chunks:
                micros = [m for m in micro if train.global_batch % m == 0]
                schedule = fixed.get("pipeline_schedule", train.pipeline_schedule)
                pipe = (
                    fixed.get("pipeline_microbatches", train.pipeline_microbatches),
                    fixed.get("pipeline_repeats", train.pipeline_repeats),
                    schedule,
                )
                free = "pipeline_schedule" not in fixed and schedule == "gpipe"
                yield fixed.get("moe", train.moe), _hashable(remat), c, micros, pipe, free


def _hashable(remat: Any) -> Remat:
    """A remat as `TrainSpec` takes it (a name, a mapping or pairs), made hashable: a name as it
    is, else its (tensor, placement) pairs as tuples."""
    if isinstance(remat, str):
        return remat
    return tuple((t, p) for t, p in (remat.items() if isinstance(remat, Mapping) else remat))


def recipe_spec(train: TrainSpec, path: MoePath, remat: Remat, m: int, pipe: Pipe) -> TrainSpec:
    """`train` with a recipe's fields at one logits chunk, built once (every mesh of a search
    asks for the same few, and TrainSpec checks its fields when built)."""
    return _spec(train, type(train.capacity_factor).__name__, path, remat, m, pipe, 1)


def with_chunks(train: TrainSpec, chunks: int) -> TrainSpec:
    """`train` at `chunks` logits chunks, built once (as `recipe_spec`)."""
    pipe = (train.pipeline_microbatches, train.pipeline_repeats, train.pipeline_schedule)
    kind = type(train.capacity_factor).__name__
    return _spec(train, kind, train.moe, train.remat, train.microbatches, pipe, chunks)


@lru_cache(maxsize=65536)
def _spec(
    train: TrainSpec, kind: str, path: MoePath, remat: Remat, m: int, pipe: Pipe, chunks: int
) -> TrainSpec:
    """`train` with these recipe fields; `kind`, the type name of its capacity factor, in the key:
    TrainSpecs equal but for an int or float factor give their own."""
    pm, pr, schedule = pipe
    return replace(
        train, moe=path, remat=remat, microbatches=m, logits_chunks=chunks,
        pipeline_microbatches=pm, pipeline_repeats=pr, pipeline_schedule=schedule,
    )  # fmt: skip


def terms_of(
    model: ModelSpec, t: TrainSpec, r: Roles, facts: DeviceFacts, across: bool
) -> dict[str, int]:
    """A recipe's memory terms on this mesh: a pipelined step's where it has stages, else a
    plain step's (`across`: memory_terms's replicas_across_granules)."""
    st = stages_on(model, t, r)
    if st is None:
        return memory_terms(model, t, r, facts, replicas_across_granules=across)
    return pipeline_memory_terms(model, t, r, st, facts, replicas_across_granules=across)


@dataclass(frozen=True)
class Limits:
    """What a recipe may use of a device's memory: `device` the headroom's limit, `possible`
    what the compiled step may still fit in by the model's largest measured overestimate
    (cost/band.py), `host` the host memory's limit (infinite where the catalogue has none:
    the offload is assumed to fit)."""

    device: float
    possible: float
    host: float

    @classmethod
    def of(cls, facts: DeviceFacts, headroom: float) -> Limits:
        limit = facts.hbm_bytes * (1 - headroom)
        band = memory_band(facts.platform)
        host = facts.host_memory_bytes
        return cls(
            device=limit,
            possible=max(limit, facts.hbm_bytes * (band.high if band else 1.0)),
            host=math.inf if host is None else host * (1 - headroom),
        )


class MeshRecipes:
    """The recipes of one mesh as the search tries them, each thing found once: a recipe's
    TrainSpec, whether the pipeline takes its micro-batches and a chunk count divides a
    device's tokens, and its memory terms and peak (they do not depend on device order); the
    peaks of the recipes that do not fit gathered in `least`."""

    def __init__(
        self,
        model: ModelSpec,
        train: TrainSpec,
        r: Roles,
        facts: DeviceFacts,
        across: bool,
        limits: Limits,
    ) -> None:
        self.model, self.train, self.r, self.facts = model, train, r, facts
        self.across, self.limits = across, limits
        self.least: list[int] = []  # the peak memory of each recipe that does not fit
        # (path, remat, M, pipe) -> TrainSpec at C = 1, however the remat is spelt
        self._specs: dict[tuple[MoePath, Remat, int, Pipe], TrainSpec] = {}
        self._staged: dict[tuple[int, Pipe], bool] = {}  # (M, pipe) -> the pipeline takes it
        self._chunks: dict[int, bool] = {}  # whether C chunks divide a device's tokens
        # (path, remat, M, pipe) -> terms at C = 1 and each phase's total (None: over the host
        # memory's limit)
        self._priced: dict[
            tuple[MoePath, Remat, int, Pipe], tuple[dict[str, int], dict[str, int]] | None
        ] = {}
        # ... and at C chunks: (terms, peak)
        self._peaks: dict[
            tuple[tuple[MoePath, Remat, int, Pipe], int], tuple[dict[str, int], int]
        ] = {}

    def spec(self, path: MoePath, remat: Remat, m: int, pipe: Pipe = (0, 1, "gpipe")) -> TrainSpec:
        """The recipe's TrainSpec at one logits chunk."""
        key = (path, remat, m, pipe)
        if key not in self._specs:
            self._specs[key] = recipe_spec(self.train, path, remat, m, pipe)
        return self._specs[key]

    def staged(self, path: MoePath, remat: Remat, micro: list[int], pipe: Pipe) -> list[int]:
        """The micro-batch counts of `micro` whose pipeline fields fit the model and the batch
        (`stages_of`: they depend on M and the pipeline's fields alone)."""
        out = []
        for m in micro:
            if (m, pipe) not in self._staged:
                try:
                    stages_on(self.model, self.spec(path, remat, m, pipe), self.r)
                    self._staged[m, pipe] = True
                except MeshConfigError:  # the pipeline's fields do not fit
                    self._staged[m, pipe] = False
            if self._staged[m, pipe]:
                out.append(m)
        return out

    def over_floor(self, rows: int, wanted: list[dict[str, Any]]) -> bool:
        """Whether, on a mesh with a pipeline, every pipeline searched holds more than the
        model's error leaves possible in the terms no recipe changes
        (`pipeline_memory_floor`), so that no recipe fits."""
        floors: dict[Pipe, int] = {}
        for path, remat, _, micro, pipe, _ in recipe_space(self.train, rows, wanted):
            micro = [] if pipe in floors else self.staged(path, remat, micro, pipe)
            t = self.spec(path, remat, micro[0], pipe) if micro else None
            if t is None or "offload" in t.placements.values():
                continue  # found, or no recipe of this pipeline and remat is priced
            st = stages_on(self.model, t, self.r)
            assert st is not None  # the mesh has a pipeline axis larger than 1
            floors[pipe] = pipeline_memory_floor(
                self.model, t, self.r, st, self.facts, replicas_across_granules=self.across
            )
            if floors[pipe] <= self.limits.possible:
                return False
        return True

    def chunks_ok(self, first: TrainSpec, c: int) -> bool:
        """Whether `c` logits chunks divide a device's tokens (`check_fit`, with the first
        recipe that asks)."""
        if c not in self._chunks:
            try:
                check_fit(self.model, replace(first, logits_chunks=c), self.r)
                self._chunks[c] = True
            except MeshConfigError:  # the chunks do not divide a device's tokens
                self._chunks[c] = False
        return self._chunks[c]

    def fits(self, t: TrainSpec, chunks: int, limit: float) -> tuple[dict[str, int], int] | None:
        """The recipe's terms at `chunks` logits chunks and their peak where it is within
        `limit`, else None (its peak gathered in `least`; none where its offload is over the
        host's)."""
        pipe = (t.pipeline_microbatches, t.pipeline_repeats, t.pipeline_schedule)
        key = (t.moe, t.remat, t.microbatches, pipe)
        if key not in self._priced:
            over = host_bytes(self.model, t, self.r, self.facts) > self.limits.host
            base = None if over else terms_of(self.model, t, self.r, self.facts, self.across)
            self._priced[key] = None if base is None else (base, phases(base)[0])
        priced = self._priced[key]
        if priced is None:
            return None
        if (key, chunks) not in self._peaks:
            base, totals = priced
            logits = -(-base["logits"] // chunks)
            # the peak is the largest phase's total: only the logits' phases change with C
            changed = logits - base["logits"]
            peak = max(v + changed * (p in TERMS["logits"]) for p, v in totals.items())
            self._peaks[key, chunks] = base | {"logits": logits}, peak
        terms, peak = self._peaks[key, chunks]
        if peak > limit:
            self.least.append(peak)
            return None
        return terms, peak

    def fewest(
        self, path: MoePath, remat: Remat, c: int, micro: list[int], pipe: Pipe, at: float
    ) -> Recipe | None:
        """The recipe with the fewest micro-batches whose peak is within `at`, by bisection
        (memory falls as micro-batches grow)."""
        lo, hi, found = 0, len(micro) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            t = self.spec(path, remat, micro[mid], pipe)
            fit = self.fits(t, c, at)
            if fit is None:
                lo = mid + 1
            else:
                found, hi = Recipe(t, *fit), mid - 1
        return found

    def found(
        self, path: MoePath, remat: Remat, c: int, micro: list[int], pipe: Pipe
    ) -> Recipe | None:
        """The fewest micro-batches within the headroom's limit; where none is, the fewest
        that the model's measured error leaves possible, marked `beyond`."""
        found = self.fewest(path, remat, c, micro, pipe, self.limits.device)
        if found is None and self.limits.possible > self.limits.device:
            unsure = self.fewest(path, remat, c, micro, pipe, self.limits.possible)
            found = None if unsure is None else replace(unsure, beyond=True)
        return found


def fitting_recipes(
    model: ModelSpec,
    train: TrainSpec,
    wanted: list[dict[str, Any]],
    r: Roles,
    facts: DeviceFacts,
    replicas_across_granules: bool,
    headroom: float,
    *,
    floor: bool = True,
) -> tuple[list[Recipe], int | None]:
    """The recipes that fit this mesh (each with its memory terms), and the least device
    memory of those that do not (for the error when none fits). Memory falls as micro-batches
    grow, so the fewest that fit are found by bisection; logits chunks change only the logits
    term, so each remat and micro-batch count is priced once for every chunk count.
    `replicas_across_granules`: memory.memory_terms's (estimate.holds_tables). `floor`: a mesh
    whose terms no recipe changes (memory.memory_floor: parameters, optimizer state, gradient
    shards, tables, the batch; with a pipeline pipeline_memory_floor, for every pipeline
    searched) exceed the limit gets no recipe and no least at once (most meshes of a large
    MoE). Where no micro-batch count of a remat and chunk count fits the
    headroom's limit, the fewest that the model's measured error leaves possible (cost/band.py:
    up to the HBM times its largest overestimate) is kept, marked `beyond`."""
    limits, across = Limits.of(facts, headroom), replicas_across_granules
    staged = r.size("pipeline") > 1
    search = MeshRecipes(model, train, r, facts, across, limits)
    rows = train.global_batch // r.size("batch")
    # the terms no recipe changes exceed what may fit: no recipe, and no least
    if floor and staged and search.over_floor(rows, wanted):
        return [], None
    if (
        floor
        and not staged
        and memory_floor(model, train, r, facts, replicas_across_granules=across) > limits.possible
    ):
        return [], None
    offloads = not missing_host_facts(facts)
    out: list[Recipe] = []
    seen: set[tuple[MoePath, Remat, int, int, Pipe]] = set()  # (path, remat, C, M, pipe) found
    for path, remat, c, micro, pipe, free in recipe_space(train, rows, wanted):
        if staged:
            micro = search.staged(path, remat, micro, pipe)
        if not micro:
            continue
        first = search.spec(path, remat, micro[0], pipe)
        if "offload" in first.placements.values() and (staged or not offloads):
            continue  # the catalogue cannot judge an offload here (none beside a pipeline)
        if not search.chunks_ok(first, c):
            continue
        found = [(search.found(path, remat, c, micro, pipe), pipe)]
        # 1F1B recomputes every layer whatever the policy (pipeline/stages.py `stage_train`):
        # searched under full remat alone, which is what it runs
        if staged and free and remat == "full" and not _best(found[0][0], micro[0]):
            other: Pipe = (pipe[0], pipe[1], "1f1b")
            staged_1f1b = search.staged(path, remat, micro, other)
            if staged_1f1b:
                found.append((search.found(path, remat, c, staged_1f1b, other), other))
        for f, p in found:
            if f is None or (path, first.remat, c, f.train.microbatches, p) in seen:
                continue
            seen.add((path, first.remat, c, f.train.microbatches, p))
            out.append(replace(f, train=with_chunks(f.train, c)))
    return out, min(search.least, default=None)


def _best(found: Recipe | None, fewest: int) -> bool:
    """Whether a GPipe recipe under full remat leaves 1F1B nothing to win: it fits within the
    headroom at the fewest micro-batches searched. 1F1B's step is that recipe's work and more
    bytes on the pipeline axis (its head's float32 sums where GPipe moves its results in the
    compute dtype: cost/pipeline/traffic.py `_head`), so it can win only by fitting where GPipe
    does not, or with fewer micro-batches."""
    return found is not None and not found.beyond and found.train.microbatches == fewest


def check_recipes(
    recipes: Iterable[Mapping[str, Any]] | None, train: TrainSpec
) -> list[dict[str, Any]]:
    """`recipes` as a list of dicts of recipe fields, each checked by building its TrainSpec."""
    if recipes is None:
        return [{}]
    accepted = (
        f"accepted: an iterable of mappings from {', '.join(RECIPE_FIELDS)} to values, e.g. "
        "[{'remat': 'offload', 'microbatches': 2}]"
    )
    if isinstance(recipes, str | bytes | Mapping) or not isinstance(recipes, Iterable):
        raise MeshConfigError(f"recipes={recipes!r}; {accepted}")
    out = []
    for item in recipes:
        if not isinstance(item, Mapping):
            raise MeshConfigError(f"recipes: {item!r} is no mapping; {accepted}")
        unknown = sorted(set(item) - set(RECIPE_FIELDS))
        if unknown:
            raise MeshConfigError(f"recipes: unknown field {unknown[0]!r}; {accepted}")
        replace(train, **item)  # each value checked as TrainSpec checks it
        out.append(dict(item))
    if not out:
        raise MeshConfigError(f"recipes=[] holds no recipe; {accepted}")
    return out


@cache
def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
