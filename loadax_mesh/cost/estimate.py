"""`estimate(plan, model, train)`: memory, compute, collectives and step time per device.

The step's cost is cost/step.py's `PlainStep` interface (the plain or the pipelined step,
decided once);
this module sums its parts into the answer: the memory terms and their peak with the fit
verdict, the collectives per mesh axis, the step time (cost/timing/step.py: matmuls and
attention kernels at the calibrated share of the peak, memory-bound operations at HBM
bandwidth, collectives inside a granule hidden up to the compute where they overlap and
exposed where they feed the next operation, collectives across granules exposed), MFU and the
bottleneck.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError
from ..hardware.profile import DeviceFacts, HardwareProfile, hardware_profile
from ..workload.layout import Roles, check_fit, roles
from ..workload.spec import ModelSpec, TrainSpec
from ..workload.stages import Stages
from . import band as _band
from .calibration import Calibrated
from .conditions import host_conditions, quantized_conditions
from .memory.terms import host_bytes, phases
from .step import PlainStep, step_cost
from .timing.axes import AxisTraffic
from .timing.step import StepTime

if TYPE_CHECKING:
    from ..plan import MeshPlan

OVERLAP = (
    "inside granules, FSDP gathers and gradient reductions hide behind compute (on TPU but a "
    "layer's attention weights, gathered in line each pass), tensor-parallel "
    "collectives wait but those the TPU compiler overlaps with matmuls, sequence collectives "
    "wait; collectives across granules are exposed; "
    "offload copies hide behind their own pass's compute on TPU (out: forward, in: backward) "
    "and wait on GPU; "
    "step = max(compute, hidden) + exposed + across granules + exposed offload"
)


@dataclass(frozen=True)
class Estimate:
    """The cost model's answer for one plan; bytes and seconds are per device and per step."""

    hardware: str
    mesh: dict[str, int]
    model: str
    global_batch: int
    remat: str  # the recipe priced: remat as the command line writes it,
    microbatches: int  # gradient accumulation steps,
    logits_chunks: int  # and the slices of the loss
    moe: str | None  # a model with experts: its path ("dropless", "capacity"); else None
    memory: dict[str, int]  # the terms live at the peak (a term not live there is 0)
    memory_bytes: int  # their sum: the peak
    terms: dict[str, int]  # every term at its full size
    phases: dict[str, int]  # each phase's total
    hbm_bytes: int
    host_bytes: int  # offloaded activations held in host memory
    host_memory_bytes: int | None  # what one device may use of its host (None: not offloading
    # and the catalogue does not know it)
    fits: bool  # memory_bytes <= hbm_bytes and host_bytes <= host_memory_bytes
    # The fit with the model's measured error (cost/band.py): "fits", "does not fit", or
    # "within the model's error" (compile to confirm: `confirm`)
    verdict: str
    confirm: str | None  # within the model's error: the command that compiles it; else None
    flops: float  # executed, remat recompute included
    recompute_flops: float  # of which the backward pass's recompute
    model_flops: float  # the model's own (6 per parameter and token plus causal attention)
    compute_seconds: float  # matmuls, attention kernels and memory-bound operations
    time: StepTime  # the step's seconds, term by term
    axes: dict[str, AxisTraffic]
    offload_bytes: int  # per step, each way over the host link
    offload_seconds: float  # the larger direction's transfer time
    offload_exposed_seconds: float  # what the two directions add to the step
    step_seconds: float
    tokens_per_second: float
    mfu: float
    bottleneck: str
    profile: HardwareProfile = field(repr=False, compare=False)  # the hardware it priced
    # The conditions the answer rests on where a fact it needs has no source (each with its
    # threshold and the step at it); empty: none
    assumes: tuple[str, ...] = ()
    given: dict[str, str] = field(default_factory=dict)  # facts the user gave: name -> value
    overlap: str = OVERLAP
    # the pipeline stages priced (workload/stages.py; bubble and iterations with them); None
    # without
    pipeline: Stages | None = None
    # the recipe priced, as the step runs it (`stages.resolved`: a pipelined step's micro-batch
    # count, pipelined layers and stage remat filled in)
    train: TrainSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: every field but the profile, whose platform it names instead."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["time"] = asdict(self.time)
        data["axes"] = {k: v.to_dict() for k, v in self.axes.items()}
        data["pipeline"] = None if self.pipeline is None else self.pipeline.to_dict()
        data["train"] = None if self.train is None else asdict(self.train)
        data["profile"] = self.profile.platform
        return deepcopy({"platform" if k == "profile" else k: v for k, v in data.items()})


def estimate(
    plan: MeshPlan,
    model: ModelSpec | str,
    train: TrainSpec,
    *,
    facts: Mapping[str, str | float] | None = None,
) -> Estimate:
    """Estimate the reference step on `plan` with the cost model (no jax).

    Args:
        plan: a plan whose hardware string is in the catalogue (simulated devices are fine).
        model: the model's shape, or a catalogue name (as `choose_mesh` takes).
        train: the batch, dtypes and recipe.
        facts: catalogue facts of the hardware set for this estimate, each a value with its
            unit (`{"host_link_bandwidth": "100 GB/s"}`); reported as given by the user.

    Returns:
        The `Estimate`: memory terms, compute, collectives per axis, step time, MFU, the
        bottleneck, the fit verdict with the model's error, and the conditions it rests on
        where a fact it needs has no source (`assumes`).

    Raises:
        MeshConfigError: a model name or hardware the catalogue does not know, a fact it
            lacks that the estimate cannot answer on a condition, a bad `facts` entry, a
            model, batch or recipe that does not divide over the plan's axes, or offloaded
            tensors beside pipeline stages (not priced yet).
    """
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    r, factors, efficiency, device = plan_parts(plan, facts)
    check_fit(model, train, r)
    return estimate_parts(model, train, r, factors, efficiency, device)


def plan_parts(
    plan: MeshPlan, facts: Mapping[str, str | float] | None = None
) -> tuple[Roles, dict[str, tuple[int, int]], dict[str, float], DeviceFacts]:
    """What `estimate_parts` reads of a plan (besides the model and train spec)."""
    if plan.hardware is None:
        raise MeshConfigError(
            "plan.hardware=None: the estimate needs the catalogue's facts; accepted: a plan over "
            "simulate_devices(...) or with selector= naming catalogue hardware"
        )
    profile = hardware_profile(plan.hardware, facts)
    facts_ = profile.facts_for(math.prod(plan.shape.values()))
    r = roles(tuple(plan.shape.items()), plan.batch_axis_names)
    factors = {
        a: (i, d)
        for a, i, d in zip(plan.axis_names, plan.ici_mesh_shape, plan.dcn_mesh_shape, strict=True)
    }
    return r, factors, {a: q.link_factor for a, q in plan.quality().items()}, facts_


def estimate_parts(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
    *,
    terms: dict[str, int] | None = None,
    compute_efficiency: float | None = None,
    intensity: float | None = None,
    dcn_latency: float | None = None,
    slice_bandwidth: float | None = None,
    permute_share: float | None = None,
) -> Estimate:
    """The estimate from its parts (what `choose_mesh` varies without building a plan);
    `terms` are the memory terms when already computed (they do not depend on the plan). The
    keyword calibrations replace the platform's named ones (configs/calibration.toml,
    `Calibrated`; a chip with measured shares of its peak in the catalogue uses those in place
    of `compute_efficiency`); `float("inf")`: no limit."""
    calibrated = Calibrated.of(
        facts.platform, compute_efficiency=compute_efficiency, intensity=intensity,
        permute_share=permute_share, dcn_latency=dcn_latency, slice_bandwidth=slice_bandwidth,
    )  # fmt: skip
    return price(model, train, r, factors, efficiency, facts, calibrated, terms=terms).estimate()


@dataclass(frozen=True)
class Priced:
    """A step priced on a mesh, before its answer is written out: what the chooser ranks a
    recipe by (`time`, `axes`, `assumes`; the peak of `terms`) and `estimate`, the whole
    answer."""

    step: PlainStep
    facts: DeviceFacts
    factors: dict[str, tuple[int, int]]
    terms: dict[str, int]
    axes: dict[str, AxisTraffic]
    time: StepTime
    host: int

    @property
    def assumes(self) -> tuple[str, ...]:
        """The conditions the answer rests on (`Estimate.assumes`): with nothing offloaded,
        none of the host's."""
        if not self.host:
            return quantized_conditions(self.facts, self.step.train)
        return _conditions(self.facts, self.step.train, self.host, self.time)[0]

    def estimate(self) -> Estimate:
        return _answer(self.step, self.facts, self.factors, self.terms, self.axes, self.time,
                       self.host)  # fmt: skip


def price(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
    calibrated: Calibrated,
    *,
    terms: dict[str, int] | None = None,
    dcn: DeviceFacts | None = None,
) -> Priced:
    """`estimate_parts`'s step priced, with the calibrations given; `dcn`: the device's facts
    across granules on these factors (`across_granules`) where already found (a search
    prices every recipe of a mesh on the same)."""
    step = step_cost(model, train, r)
    if terms is None:
        held = holds_tables(facts, r, factors)
        terms = step.memory_terms(facts, replicas_across_granules=held)
    if dcn is None:
        dcn = across_granules(facts, factors, calibrated.dcn_latency, calibrated.slice_bandwidth)
    traits = facts.traits
    found = step.collectives(
        overlapped=traits.overlaps_tensor_collectives, regather=traits.regathers_attention_weights
    )
    axes = step.axes(found, factors, efficiency, dcn)
    host = host_bytes(model, train, r, facts)
    moved = host * train.microbatches  # every micro-batch writes and reads its own
    if moved and facts.host_link_bandwidth is None and not traits.offload_overlaps_compute:
        facts.need("host_link_bandwidth")  # copies that wait: no bandwidth makes them free
    t = step.time(
        facts, waits(axes), calibrated, offload_bytes=moved, kept_bytes=terms["activations"]
    )
    return Priced(step, facts, factors, terms, axes, t, host)


def waits(axes: dict[str, AxisTraffic]) -> tuple[float, float, float]:
    """The collectives' seconds as the step time adds them: hidden inside granules (up to the
    compute), exposed inside granules, and across granules (exposed)."""
    hidden = sum(a.seconds - a.exposed_seconds for a in axes.values())
    exposed = sum(a.exposed_seconds - a.dcn_seconds for a in axes.values())
    across = sum(a.dcn_seconds for a in axes.values())
    return hidden, exposed, across


def _answer(
    step: PlainStep,
    facts: DeviceFacts,
    factors: dict[str, tuple[int, int]],
    terms: dict[str, int],
    axes: dict[str, AxisTraffic],
    t: StepTime,
    host: int,
) -> Estimate:
    """The Estimate of a priced step: its memory at the peak with the fit verdict (the model's
    measured error, cost/band.py), its time with MFU and bottleneck, and the conditions the
    answer rests on."""
    model, train, r = step.model, step.train, step.roles
    totals, live = phases(terms)
    at_peak = {k: (v if k in live else 0) for k, v in terms.items()}
    flops, model_flops, recompute = step.flops(grouped=facts.traits.grouped_matmul)
    moved = host * train.microbatches
    devices = math.prod(size for _, size in r.sizes)
    peak = sum(at_peak.values())
    profile = hardware_profile(facts.hardware)
    assumes, link = _conditions(facts, train, host, t)
    host_memory = facts.host_memory_bytes
    verdict = _band.fit_verdict(peak, facts.hbm_bytes, _band.memory_band(facts.platform))
    if host and host_memory is not None and host > host_memory:
        verdict = _band.DOES_NOT_FIT
    unsure = verdict == _band.UNSURE
    return Estimate(
        hardware=facts.hardware,
        mesh=dict(r.sizes),
        model=model.name,
        global_batch=train.global_batch,
        remat=train.remat_text,
        microbatches=train.microbatches,
        logits_chunks=train.logits_chunks,
        moe=train.moe if model.num_experts else None,
        memory=at_peak,
        memory_bytes=peak,
        terms=terms,
        phases=totals,
        hbm_bytes=int(facts.hbm_bytes),
        host_bytes=host,
        host_memory_bytes=None if host_memory is None else int(host_memory),
        fits=peak <= facts.hbm_bytes and (not host or host <= (host_memory or host)),
        verdict=verdict,
        confirm=_band.compile_command(facts, r, factors, model, train) if unsure else None,
        flops=flops,
        recompute_flops=recompute,
        model_flops=model_flops,
        compute_seconds=t.compute,
        time=t,
        axes=axes,
        offload_bytes=moved,
        offload_seconds=moved / link if moved else 0.0,
        offload_exposed_seconds=t.offload,
        step_seconds=t.seconds,
        tokens_per_second=train.global_batch * model.seq_len / devices / t.seconds,
        mfu=model_flops / (t.seconds * facts.peak_flops),
        bottleneck=_bottleneck(t, axes),
        profile=profile,
        assumes=assumes,
        given={g.name: g.text for g in facts.given},
        pipeline=step.pipeline,
        train=train,
    )


def _conditions(
    facts: DeviceFacts, train: TrainSpec, host: int, t: StepTime
) -> tuple[tuple[str, ...], float]:
    """The conditions the answer rests on (host facts, carried calibrations), and the host
    link bandwidth its offload is priced at (`host_conditions`)."""
    moved = host * train.microbatches
    assumes, link = host_conditions(facts, hardware_profile(facts.hardware), host, moved, t)
    return assumes + quantized_conditions(facts, train), link


def _bottleneck(t: StepTime, axes: dict[str, AxisTraffic]) -> str:
    """What the step waits for most: an exposed collective, the host link, the collectives
    that no longer hide, or the compute (and then which part of it)."""
    compute = t.compute
    exposed = max(axes.values(), key=lambda a: a.exposed_seconds, default=None)
    worst = max((a.exposed_seconds for a in axes.values()), default=0.0)
    if t.offload > 0.5 * compute and t.offload >= worst:
        return "host offload (PCIe transfers exposed)"
    slowest = max(axes.values(), key=lambda a: a.seconds, default=None)
    if exposed is not None and exposed.exposed_seconds > 0.5 * compute:
        return f"{exposed.role} axis {exposed.axis!r} (exposed {_where(exposed)})"
    if slowest is not None and t.hidden > compute:
        return f"{slowest.role} axis {slowest.axis!r} ({_where(slowest)}; hides no more)"
    parts = {"matmuls": t.matmul, "attention": t.attention, "memory-bound ops": t.memory_bound}
    return f"compute ({max(parts, key=lambda k: parts[k])})"


def across_granules(
    facts: DeviceFacts, factors: dict[str, tuple[int, int]], latency: float, granule: float
) -> DeviceFacts:
    """The device's facts across granules as the runs reached them: a ring step's latency, and
    its bandwidth no more than its share of what its whole granule sends (`granule` bytes/s,
    shared by the granule's devices)."""
    own = facts.dcn_bandwidth
    share = granule / math.prod(ici for ici, _ in factors.values())
    return replace(
        facts, dcn_latency=latency, dcn_bandwidth=own if own is None else min(own, share)
    )


def holds_tables(facts: DeviceFacts, r: Roles, factors: dict[str, tuple[int, int]]) -> bool:
    """Whether the step holds the embedding tables' gradients for a reduction across TPU
    slices: a data-parallel axis (parameters replicated) with a DCN factor; see
    memory.memory_terms. An FSDP axis across slices reduces them in one collective over both
    factors as soon as they are computed (libtpu, LLaMA-3.1 405B on 2 x v6e-256)."""
    across = any(factors[a][1] > 1 for a in r.data_parallel_axes())
    return facts.traits.holds_reduced_gradients and across


def _where(a: AxisTraffic) -> str:
    return "DCN" if a.dcn > 1 else "ICI"
