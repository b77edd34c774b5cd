"""`estimate(plan, model, train)`: memory, compute, collectives and step time per device.

The overlap model: collectives of parameters and gradients (FSDP gathers and reductions, the
data-parallel gradient all-reduce) run asynchronously and hide behind compute; tensor-parallel
all-reduces and sequence gathers feed the very next operation, so they are exposed. Step time =
max(compute, hidden collectives) + exposed collectives. Compute is FLOPs over the catalogue's
peak: a bound the real step approaches but does not reach, so MFU here is an upper bound too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError
from ..hardware.strings import parse_hardware
from ..workload.layout import Roles, check_fit, roles
from ..workload.spec import ModelSpec, TrainSpec
from .facts import DeviceFacts, device_facts
from .memory import Shapes, memory_terms, phases
from .traffic import AxisTraffic, axis_traffic, collectives

if TYPE_CHECKING:
    from ..plan import MeshPlan

OVERLAP = (
    "FSDP gathers, gradient reductions and the data-parallel all-reduce hide behind compute; "
    "tensor-parallel all-reduces and sequence gathers are exposed; "
    "step = max(compute, hidden) + exposed"
)


@dataclass(frozen=True)
class Estimate:
    """The cost model's answer for one plan; bytes and seconds are per device and per step."""

    hardware: str
    mesh: dict[str, int]
    model: str
    global_batch: int
    remat: str
    memory: dict[str, int]  # the terms live at the peak (a term not live there is 0)
    memory_bytes: int  # their sum: the peak
    terms: dict[str, int]  # every term at its full size
    phases: dict[str, int]  # each phase's total
    hbm_bytes: int
    fits: bool
    flops: float  # executed, remat recompute included
    compute_seconds: float
    axes: dict[str, AxisTraffic]
    step_seconds: float
    tokens_per_second: float
    mfu: float
    bottleneck: str
    overlap: str = OVERLAP

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["axes"] = {k: v.to_dict() for k, v in self.axes.items()}
        return data


def estimate(plan: MeshPlan, model: ModelSpec, train: TrainSpec) -> Estimate:
    """Estimate the reference step on `plan` (its hardware string must be in the catalogue)."""
    if plan.hardware is None:
        raise MeshConfigError(
            "plan.hardware=None: the estimate needs the catalogue's facts; accepted: a plan over "
            "simulate_devices(...) or with selector= naming catalogue hardware"
        )
    facts = device_facts(parse_hardware(plan.hardware))
    r = roles(tuple(plan.shape.items()), plan.batch_axis_names)
    check_fit(model, train, r)
    factors = {
        a: (i, d)
        for a, i, d in zip(plan.axis_names, plan.ici_mesh_shape, plan.dcn_mesh_shape, strict=True)
    }
    efficiency = {a: q.efficiency for a, q in plan.quality().items()}
    return estimate_parts(model, train, r, factors, efficiency, facts)


def estimate_parts(
    model: ModelSpec,
    train: TrainSpec,
    r: Roles,
    factors: dict[str, tuple[int, int]],
    efficiency: dict[str, float],
    facts: DeviceFacts,
    *,
    terms: dict[str, int] | None = None,
) -> Estimate:
    """The estimate from its parts (what `choose_mesh` varies without building a plan);
    `terms` are the memory terms when already computed (they do not depend on the plan)."""
    if terms is None:
        terms = memory_terms(
            model, train, r, facts.tile, batch_across_granules=holds_tables(facts, r, factors)
        )
    totals, live = phases(terms)
    at_peak = {k: (v if k in live else 0) for k, v in terms.items()}
    flops, model_flops = step_flops(model, train, r)
    compute = flops / facts.peak_flops
    axes = axis_traffic(collectives(model, train, r), r, factors, efficiency, facts)
    hidden = sum(a.seconds - a.exposed_seconds for a in axes.values())
    exposed = sum(a.exposed_seconds for a in axes.values())
    step = max(compute, hidden) + exposed
    devices = 1
    for _, size in r.sizes:
        devices *= size
    peak = sum(at_peak.values())
    return Estimate(
        hardware=facts.hardware,
        mesh=dict(r.sizes),
        model=model.name,
        global_batch=train.global_batch,
        remat=train.remat_text,
        memory=at_peak,
        memory_bytes=peak,
        terms=terms,
        phases=totals,
        hbm_bytes=int(facts.hbm_bytes),
        fits=peak <= facts.hbm_bytes,
        flops=flops,
        compute_seconds=compute,
        axes=axes,
        step_seconds=step,
        tokens_per_second=train.global_batch * model.seq_len / devices / step,
        mfu=model_flops / (step * facts.peak_flops),
        bottleneck=_bottleneck(compute, hidden, axes),
    )


def step_flops(model: ModelSpec, train: TrainSpec, r: Roles) -> tuple[float, float]:
    """(FLOPs executed, model FLOPs) per device per step. A layer's forward is 2 FLOPs per
    weight per token plus causal attention (half of 4 * seq * heads * head_dim per token); the
    backward pass is twice the forward; full remat runs each layer's forward once more."""
    sh = Shapes.of(model, train, r)
    m = r.size("model")
    layer = 2 * (model.layer_params - 2 * model.d_model) + 2 * model.seq_len * model.num_heads * (
        model.head_dim
    )
    head = 2 * model.vocab_size * model.d_model
    forward = sh.tokens * (model.num_layers * layer + head) / m
    recompute = sh.tokens * model.num_layers * layer / m if train.remat == "full" else 0.0
    return 3 * forward + recompute, 3 * forward


def _bottleneck(compute: float, hidden: float, axes: dict[str, AxisTraffic]) -> str:
    exposed = max(axes.values(), key=lambda a: a.exposed_seconds, default=None)
    slowest = max(axes.values(), key=lambda a: a.seconds, default=None)
    if exposed is not None and exposed.exposed_seconds > 0.5 * compute:
        return f"{exposed.role} axis {exposed.axis!r} (exposed {_where(exposed)})"
    if slowest is not None and hidden > compute:
        return f"{slowest.role} axis {slowest.axis!r} ({_where(slowest)}; hides no more)"
    return "compute"


def holds_tables(facts: DeviceFacts, r: Roles, factors: dict[str, tuple[int, int]]) -> bool:
    """Whether the step holds the embedding tables' gradients for a reduction across TPU
    slices (a batch axis with a DCN factor; see memory.memory_terms)."""
    return facts.platform == "tpu" and any(factors[a][1] > 1 for a in r.batch)


def _where(a: AxisTraffic) -> str:
    return "DCN" if a.dcn > 1 else "ICI"
