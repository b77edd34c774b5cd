"""`choose_mesh`: every shape and ICI/DCN split of the axes over the
hardware, estimated, the ones that fit ranked by step time.

Candidates are the ordered factorisations of the device count over the axes that the model
divides (heads, kv heads, d_ff and vocabulary by the tensor axis; d_model by FSDP; the sequence
by the sequence axis; the global batch by the batch axes), times every way of spreading the
granules (slices, NVLink domains) over them. Pruned, and counted: tensor or sequence axes across
granules (their collectives are exposed, DCN makes them strictly slower than the same shape with
that factor on a batch axis). Memory does not depend on device order, so candidates that do not
fit are dropped before planning; the rest are estimated with perfect rings first, which bounds
their real time from below, and only those whose bound can still reach the top are planned by
the real planner and estimated on its rings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from functools import cache
from itertools import product
from typing import Any

from ..config import MeshConfig
from ..errors import MeshConfigError
from ..hardware.strings import parse_hardware, simulate_devices
from ..plan import MeshPlan, plan_config
from ..shapes import HybridMeshShape
from ..workload.layout import ROLE_NAMES, Roles, check_fit, roles
from ..workload.spec import ModelSpec, TrainSpec
from .estimate import Estimate, estimate_parts, holds_tables
from .facts import device_facts
from .memory import memory_terms, phases

AXES = ("data", "fsdp", "seq", "model")
_BATCH = ("data", "replicate", *ROLE_NAMES["fsdp"])


@dataclass(frozen=True, eq=False)
class Choice:
    """One ranked mesh: its config (a HybridMeshShape over the axes), plan and estimate."""

    config: MeshConfig
    plan: MeshPlan
    estimate: Estimate

    @property
    def ici(self) -> tuple[int, ...]:
        return self.plan.ici_mesh_shape

    @property
    def dcn(self) -> tuple[int, ...]:
        return self.plan.dcn_mesh_shape


class Ranking(list[Choice]):
    """The best choices, best first, and how the search went: `considered` shapes times splits,
    `pruned` (reason -> count), `planned` by the real planner and estimated on its rings."""

    def __init__(self) -> None:
        super().__init__()
        self.considered = 0
        self.pruned: dict[str, int] = {}
        self.planned = 0


def choose_mesh(
    hardware: str,
    model: str | ModelSpec,
    train: TrainSpec,
    *,
    axes: Sequence[str] = AXES,
    top: int = 5,
    headroom: float = 0.1,
) -> Ranking:
    """The `top` fitting meshes of `axes` for `model` (a ModelSpec or a name from
    configs/models/) on `hardware`, fastest first; each Choice carries its MeshConfig, MeshPlan
    and Estimate. A mesh fits when its estimate leaves `headroom` of the HBM free: what the
    estimate may miss (against the compiler it is within 20%, benchmarks/bench_cost.py)."""
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    names = _check_axes(axes, top)
    if isinstance(headroom, bool) or not isinstance(headroom, float) or not 0 <= headroom < 1:
        raise MeshConfigError(f"headroom={headroom!r}; accepted: a float in [0, 1)")
    spec = parse_hardware(hardware)
    facts = device_facts(spec)
    devices = simulate_devices(spec)
    batch = tuple(a for a in names if a in _BATCH)
    n, granules = spec.num_devices, spec.granules
    ranking = Ranking()
    fitting: list[tuple[tuple[float, float, int], Roles, tuple[int, ...], tuple[int, ...]]] = []
    smallest: int | None = None
    batch_ok = False
    for sizes in _factorisations(n, len(names)):
        r = roles(tuple(zip(names, sizes, strict=True)), batch)
        try:
            check_fit(model, train, r)
        except MeshConfigError:
            batch_ok |= train.global_batch % r.size("batch") == 0
            splits = _splits(sizes, granules)
            ranking.considered += splits
            _count(ranking.pruned, "the model or batch does not divide", splits)
            continue
        batch_ok = True
        memory: dict[bool, dict[str, int]] = {}  # by estimate.holds_tables
        for dcn in _dcn_splits(sizes, granules):
            ranking.considered += 1
            if any(d > 1 and a in (r.model, r.seq) for a, d in zip(names, dcn, strict=True)):
                _count(ranking.pruned, "tensor or sequence axis across granules", 1)
                continue
            ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
            factors = dict(zip(names, zip(ici, dcn, strict=True), strict=True))
            held = holds_tables(facts, r, factors)
            if held not in memory:
                memory[held] = memory_terms(model, train, r, facts.tile, batch_across_granules=held)
            terms = memory[held]
            peak = sum(terms[k] for k in phases(terms)[1])
            if peak > facts.hbm_bytes * (1 - headroom):
                smallest = peak if smallest is None else min(smallest, peak)
                _count(ranking.pruned, f"does not fit in {1 - headroom:.0%} of HBM", 1)
                continue
            bound = _key(estimate_parts(model, train, r, factors, {}, facts, terms=terms))
            fitting.append((bound, r, ici, dcn))
    if not batch_ok:
        raise MeshConfigError(
            f"global_batch={train.global_batch} is smaller than, or no multiple of, the "
            f"data-parallel degree of every mesh of {list(names)} over {n} devices; accepted: a "
            "multiple of some batch-axes product"
        )
    if not fitting:
        needed = "" if smallest is None else f" the smallest needs {smallest / 1e9:.2f} GB"
        raise MeshConfigError(
            f"model {model.name!r} with global batch {train.global_batch} fits no mesh of "
            f"{list(names)} on {hardware}:{needed} per device, the hardware has "
            f"{facts.hbm_bytes / 1e9:.2f} GB (of which the choice leaves {headroom:.0%} free)"
        )
    fitting.sort(key=lambda c: c[0])
    best: list[Choice] = []
    for bound, r, ici, dcn in fitting:
        if len(best) >= top and bound >= _key(best[top - 1].estimate):
            break  # perfect rings would not beat the top: neither will real ones
        config = MeshConfig(HybridMeshShape(ici, dcn), names, batch)
        plan = plan_config(config, devices, granule="auto", hardware=hardware)
        efficiency = {a: q.efficiency for a, q in plan.quality().items()}
        factors = dict(zip(names, zip(ici, dcn, strict=True), strict=True))
        found = estimate_parts(model, train, r, factors, efficiency, facts)
        ranking.planned += 1
        best.append(Choice(config, plan, found))
        best.sort(key=lambda c: _key(c.estimate))
    ranking.extend(best[:top])
    return ranking


def auto_preset(
    *,
    hardware: str | None = None,
    model: str | ModelSpec | None = None,
    global_batch: int | None = None,
    **train: Any,
) -> MeshConfig:
    """`MeshConfig.from_preset("auto", ...)`: the winner of `choose_mesh`."""
    axes = train.pop("axes", AXES)
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
    best = choose_mesh(hardware, model, TrainSpec(global_batch=global_batch, **train), axes=axes)
    return best[0].config


def _key(e: Estimate) -> tuple[float, float, int]:
    """Fastest first; among equals, the one that communicates least, then the smallest. With
    perfect rings each part is a lower bound of the planned one, so the key is one too."""
    return (e.step_seconds, sum(a.seconds for a in e.axes.values()), e.memory_bytes)


def _check_axes(axes: Sequence[str], top: int) -> tuple[str, ...]:
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise MeshConfigError(f"top={top!r}; accepted: an int >= 1")
    known = {"data", "replicate", *(n for names in ROLE_NAMES.values() for n in names)}
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
    for first in _divisors(n):
        for rest in _factorisations(n // first, parts - 1):
            yield (first, *rest)


def _dcn_splits(sizes: tuple[int, ...], granules: int) -> Iterator[tuple[int, ...]]:
    """Every (dcn_0, ...) with dcn_i dividing size_i and product `granules`."""
    choices = [[d for d in _divisors(s) if granules % d == 0] for s in sizes]
    for dcn in product(*choices):
        if math.prod(dcn) == granules:
            yield dcn


def _splits(sizes: tuple[int, ...], granules: int) -> int:
    return sum(1 for _ in _dcn_splits(sizes, granules))


@cache
def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _count(counts: dict[str, int], reason: str, k: int) -> None:
    counts[reason] = counts.get(reason, 0) + k
