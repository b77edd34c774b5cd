"""Compile the reference step for a plan and report what the compiler says (docs/design.md sec. 7).

Memory per device from `memory_analysis()`, fit against the catalogue's HBM (on GPU the pool
jax's client preallocates) and, for buffers a remat policy offloads, host memory against the
catalogue's host memory per device; FLOPs per step (flops.py: XLA's own cost analysis with
loop bodies counted once per trip, cuDNN attention counted from its shapes; of them, those in
fp8 or int8 matmuls), the program's own
roofline (roofline.py: per operation max(FLOPs / peak, bytes / HBM bandwidth)), and every
collective of the optimised HLO with its bytes, how often a step runs it, the mesh axes its
groups span and how many of its bytes cross hosts and granules (host_split.py). On TPU also
the memory libtpu's buffer assignment gives the program (read from its dumped memory-usage
report), which is what its own HBM check counts. On libtpu's or XLA's CUDA client's
compile-only devices this is the real TPU or GPU compiler, on a machine without either.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hardware.catalogue import host_memory_per_device
from ..hardware.gpu_targets import device_hbm
from ..hardware.profile import HardwareProfile, catalogue_profile
from ..hardware.traits import attention_kernel, platform_traits
from .flops import quantized_flops, step_flops
from .hlo import Collective, HloText, collectives
from .host_split import across_bytes
from .replica_groups import group_axes, varying_axes
from .roofline import roofline

if TYPE_CHECKING:
    from ..plan import MeshPlan
    from ..workload.spec import ModelSpec, TrainSpec

_REFUSAL = re.compile(
    r"required for [\w ]+\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"
)
_SCALE = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The compiler's memory-usage report (`xla_dump_to`): the default memory space's total.
_ASSIGNED = re.compile(r"Memory Space: default \(color=0\)\s+Total bytes: (\d+)")
# Out of HBM, libtpu rematerialises buffers beyond the step's own remat policy before it gives
# up, so its figure is for a rewritten step. With no buffer large enough to be a candidate
# (1 PiB) it reports the step as written.
_AS_WRITTEN = {"xla_tpu_rematerialization_min_size_in_bytes": 2**50}


@dataclass(frozen=True)
class CollectiveItem:
    """A collective op: kind, bytes (the full buffer over its group), times a step runs it,
    the mesh axes its groups span (None: they are no sub-grid of whole axes), the axes its
    members differ along (also for groups over part of an axis), and how many of its bytes
    cross hosts and cross granules (host_split.across_fraction; None: groups unreadable)."""

    kind: str
    bytes: int
    count: int
    axes: tuple[str, ...] | None
    spans: tuple[str, ...]
    across_hosts: int | None = None
    across_granules: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CompileReport:
    """What compiling the reference step for a plan gave; bytes are per device."""

    hardware: str
    mesh: dict[str, int]
    model: str
    global_batch: int
    remat: str
    attention: str  # what ran: "splash", "cudnn", "xla" (ring attention's tiles too) or "plain"
    compile_seconds: float
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    total_bytes: int  # argument + output + temp - alias (on refusal: the step as written)
    hbm_bytes: int | None  # what one device may use (catalogue), None if unknown
    fits: bool | None
    flops: float | None  # per device per step; None where no cost analysis answered
    collectives: tuple[CollectiveItem, ...]
    message: str | None = None  # the compiler's refusal, when it refused
    squeezed_bytes: int | None = None  # on refusal: after the compiler's own extra remat
    # Host memory (offloaded activations): host argument + output + temp - alias per device
    # from memory_analysis(), and what the catalogue gives a device of its host's memory.
    host_bytes: int | None = None
    host_memory_bytes: int | None = None
    microbatches: int = 1
    logits_chunks: int = 1
    # The compiled program's lower bound on its run time (roofline.py), None where the
    # catalogue lacks the chip's peak or HBM bandwidth or an operation was not counted.
    roofline_seconds: float | None = None
    # Of `flops`, those in matmuls whose operands are fp8 or int8 (flops.quantized_flops: the
    # optimised module's dots, convolutions and cuBLAS GEMMs, loop trips counted); None where
    # not counted (a refusal, or a matmul whose size could not be read).
    quantized_flops: float | None = None
    # TPU: the device memory libtpu's buffer assignment gives the program (its arguments and
    # its preallocated temp block), what its own HBM check counts; `memory_analysis()`'s temp
    # can exceed that block by GBs. None on other platforms, on refusal, and where the program
    # came from jax's compilation cache (no report written).
    assigned_bytes: int | None = None
    # The hardware compiled for, where the catalogue names it.
    profile: HardwareProfile | None = field(default=None, repr=False, compare=False)
    given: dict[str, str] = field(default_factory=dict)  # facts the user gave the roofline
    # The recipe compiled, resolved as the step ran it (pipeline fields left to defaults filled
    # in, `stages.resolved`): its MoE path, pipeline micro-batches, repeats and layers.
    train: TrainSpec | None = None
    moe: str | None = None  # a model with experts: the MoE path compiled; else None
    seq_len: int | None = None  # the sequence length compiled (the model's seq_len)

    def bytes_across(self) -> dict[str, int | None]:
        """Collective bytes per step: in all, inside hosts, across hosts and across granules
        (None where some collective's groups were unreadable)."""
        total = sum(c.bytes * c.count for c in self.collectives)
        hosts, granules = (
            _per_step([(getattr(c, f"across_{part}"), c.count) for c in self.collectives])
            for part in ("hosts", "granules")
        )
        inside = None if hosts is None else total - hosts
        return {
            "total": total,
            "inside_hosts": inside,
            "across_hosts": hosts,
            "across_granules": granules,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: every field but the profile, whose platform it names instead."""
        data = asdict(replace(self, profile=None))
        data["profile"] = None if self.profile is None else self.profile.platform
        data = {"platform" if k == "profile" else k: v for k, v in data.items()}
        data["collectives"] = [c.to_dict() for c in self.collectives]
        data["bytes_per_step"] = self.bytes_across()
        return data


def compile_step(
    plan: MeshPlan,
    model: ModelSpec,
    train: TrainSpec,
    *,
    facts: Mapping[str, str | float] | None = None,
) -> CompileReport:
    """Compile the reference step for `plan` and report what the compiler says.

    A TPU compile refused for lack of HBM gives a report with `fits` False, what the step as
    written needs and what the compiler's extra remat got it down to; one it compiled fits its
    device memory by the compiler's own check. The GPU compiler never refuses, and `fits`
    compares its figures with the memory jax's GPU client may use.

    Args:
        plan: a plan over real or compile-only jax devices (`topology_devices`).
        model: the model's shape.
        train: the batch, dtypes and recipe.
        facts: catalogue facts of the hardware set for this run (as `estimate`'s), which
            the roofline reads.

    Returns:
        The `CompileReport`: memory, fit, FLOPs, roofline and collectives, per device.

    Raises:
        MeshConfigError: a model or batch that does not divide over the plan's axes.
            Any other compile error propagates.
    """
    import jax

    from ..workload.stages import resolved
    from ..workload.step import make_step

    mesh = plan.to_jax_mesh()
    step = make_step(mesh, model, train, batch_axes=plan.batch_axis_names)
    common = _common(plan, mesh, model, resolved(train, step.stages), facts)
    traits = platform_traits(mesh.devices.flat[0].platform)
    start = time.perf_counter()
    lowered = step.fn.lower(*step.abstract_args())
    with tempfile.TemporaryDirectory() as dump:
        try:  # on TPU the compiler also writes its buffer assignment's report into `dump`
            compiled = lowered.compile(compiler_options=traits.compile_options(dump))
        except jax.errors.JaxRuntimeError as err:
            return _refused(lowered, err, common, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        assigned = assigned_bytes(Path(dump)) if traits.compiler_judges_fit else None
    memory = compiled.memory_analysis()
    total = held_bytes(memory)
    on_host = host_held_bytes(memory)
    hlo = HloText(compiled.as_text())
    hbm, host, profile = common["hbm_bytes"], common["host_memory_bytes"], common["profile"]
    return CompileReport(
        **common,
        compile_seconds=seconds,
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes,
        total_bytes=total,
        # libtpu refuses a program that exceeds its HBM (above); one it compiled fits by its own
        # count, which can be below `memory_analysis()`'s: its temp can exceed the preallocated
        # block the compiler assigns (MaxText's LLaMA 3.1 70B step on v6e-64, as published:
        # 35.04 GB against 33.55 usable, yet a 29.68 GB buffer assignment, and the run ran).
        fits=_fits(None if traits.compiler_judges_fit else total, hbm, on_host, host),
        flops=step_flops(compiled, hlo),
        quantized_flops=quantized_flops(hlo),
        collectives=_items(plan, mesh, hlo),
        host_bytes=on_host,
        roofline_seconds=_roofline(hlo.text, profile, mesh.devices.size),
        assigned_bytes=assigned,
    )


def _common(
    plan: MeshPlan,
    mesh: Any,
    model: ModelSpec,
    train: TrainSpec,
    facts: Mapping[str, str | float] | None,
) -> dict[str, Any]:
    """The report's fields that do not depend on how the compile went: what was compiled, for
    which hardware, and the memory a device may use (catalogue)."""
    platform = mesh.devices.flat[0].platform
    profile = catalogue_profile(plan.hardware, facts)
    hbm = device_hbm(profile.spec.type) if profile is not None else None
    if hbm is not None and profile is not None:  # compile-only v4 TensorCores: half a chip's
        hbm *= min(1.0, profile.spec.num_devices / mesh.devices.size)
    host = host_memory_per_device(profile.spec.type) if profile is not None else None
    return dict(
        hardware=plan.hardware,
        mesh=dict(mesh.shape),
        model=model.name,
        seq_len=model.seq_len,
        global_batch=train.global_batch,
        remat=train.remat_text,
        attention=_attention_run(train, platform, dict(mesh.shape)),
        hbm_bytes=None if hbm is None else int(hbm),
        host_memory_bytes=None if host is None else int(host),
        microbatches=train.microbatches,
        logits_chunks=train.logits_chunks,
        profile=profile,
        given={} if profile is None or profile.device is None else _given(profile),
        train=train,
        moe=train.moe if model.num_experts else None,
    )


def _refused(lowered: Any, err: Exception, common: dict[str, Any], seconds: float) -> CompileReport:
    """The report of a TPU compile refused for lack of HBM: what the compiler's extra remat got
    the step down to, and (compiled again with that remat off, which fails in seconds) what the
    step as written needs."""
    import jax

    squeezed, have = _refusal(err)
    as_written = squeezed
    try:
        lowered.compile(compiler_options=_AS_WRITTEN)
    except jax.errors.JaxRuntimeError as again:
        as_written = _refusal(again)[0]
    return CompileReport(
        **{**common, "hbm_bytes": have},
        compile_seconds=seconds,
        argument_bytes=None,
        output_bytes=None,
        temp_bytes=None,
        alias_bytes=None,
        total_bytes=as_written,
        fits=False,
        flops=None,
        collectives=(),
        message=str(err).strip().splitlines()[0],
        squeezed_bytes=squeezed,
    )


def _items(plan: MeshPlan, mesh: Any, hlo: HloText) -> tuple[CollectiveItem, ...]:
    """Every collective of the optimised HLO, with the mesh axes its groups span and the bytes
    it sends across hosts and across granules."""
    shape = dict(mesh.shape)
    order = plan.layout.index.reshape(-1)  # mesh order, as indices into the device table
    hosts, granules = plan.table.process_index[order], plan.layout.granule[order]
    return tuple(
        CollectiveItem(
            c.kind,
            c.bytes,
            c.count,
            _axes(c, shape),
            varying_axes(c.groups, shape),
            across_bytes(c.kind, c.bytes, c.groups, hosts),
            across_bytes(c.kind, c.bytes, c.groups, granules),
        )
        for c in collectives(hlo, mesh.devices.size, plan.table.ids[order])
    )


def assigned_bytes(dump: Path, module: str = "") -> int | None:
    """From an `xla_dump_to` directory: the default memory space's total in the memory-usage
    report of the module whose name contains `module` (arguments and the preallocated temp
    block), None where the compiler wrote none."""
    named = f"*{module}*" if module else "*"
    for report in sorted(dump.glob(named + "memory-usage-report.txt")):
        found = _ASSIGNED.search(report.read_text())
        if found is not None:
            return int(found[1])
    return None


def _attention_run(train: TrainSpec, platform: str, shape: dict[str, int]) -> str:
    """What the step's attention ran as: ring attention's tiles over a seq axis are XLA's
    einsums on every platform (workload/ring.py), else the platform's kernel for the kind."""
    if train.context_strategy == "ring" and shape.get("seq", 1) > 1:
        return "xla"
    return attention_kernel(train.attention, platform)


def _given(profile: HardwareProfile) -> dict[str, str]:
    return {g.name: g.text for g in profile.facts().given}


def _roofline(text: str, profile: HardwareProfile | None, devices: int) -> float | None:
    """The roofline of the compiled text on one of `devices` devices of the catalogue's
    hardware (compile-only v4 TensorCores: half a chip's peak and HBM bandwidth); None where
    the catalogue lacks the device's peak, HBM or HBM bandwidth, or the peak of a precision
    the program's matmuls run in."""
    facts = None if profile is None or profile.device is None else profile.facts_for(devices)
    if facts is None or facts.hbm_bandwidth is None:
        return None
    found = roofline(
        text,
        peak_flops=facts.peak_flops,
        hbm_bandwidth=facts.hbm_bandwidth,
        peak_fp8=facts.peak_fp8,
        peak_int8=facts.peak_int8,
    )
    return None if found is None else found.seconds


def held_bytes(memory: Any) -> int:
    """What a compiled program holds in device memory, from its `memory_analysis()`: arguments,
    outputs and temporaries, less the outputs that reuse (alias) donated arguments."""
    return int(
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def host_held_bytes(memory: Any) -> int:
    """What a compiled program holds in host memory (buffers offloaded to `pinned_host`), from
    the host fields of its `memory_analysis()`, counted as `held_bytes` counts the device's."""
    return int(
        memory.host_argument_size_in_bytes
        + memory.host_output_size_in_bytes
        + memory.host_temp_size_in_bytes
        - memory.host_alias_size_in_bytes
    )


def _fits(
    device: int | None, hbm: float | None, host: int, host_memory: float | None
) -> bool | None:
    """Both memories judged: False if either is over, None if one that is used is unknown;
    `device` None where the compiler has judged the device memory itself (TPU)."""
    verdicts = [True if device is None else None if hbm is None else device <= hbm]
    if host:
        verdicts.append(None if host_memory is None else host <= host_memory)
    if False in verdicts:
        return False
    return None if None in verdicts else True


def _per_step(parts: list[tuple[int | None, int]]) -> int | None:
    if any(size is None for size, _ in parts):
        return None
    return sum((size or 0) * count for size, count in parts)


def _refusal(err: Exception) -> tuple[int, int]:
    """(bytes needed, bytes available) from a TPU out-of-HBM refusal; any other error is
    raised again."""
    found = _REFUSAL.search(str(err))
    if "RESOURCE_EXHAUSTED" not in str(err) or found is None:
        raise err
    return int(float(found[1]) * _SCALE[found[2]]), int(float(found[3]) * _SCALE[found[4]])


def _axes(c: Collective, mesh_shape: dict[str, int]) -> tuple[str, ...] | None:
    return group_axes(c.groups, mesh_shape, pairs=c.kind == "collective-permute")
