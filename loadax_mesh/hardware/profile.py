"""The hardware profile: a hardware string resolved once into what the wings above read.

A platform differs from another in ways the cost model, the compiler wing and the views each
need: whether memory is tiled, which fused attention kernel jax runs, whether the compiler
itself refuses a program that does not fit, how gradients and host offloads behave. Each is a
named trait here, so no module above tests a platform's name. `HardwareProfile` adds the
catalogue's facts of one device (`DeviceFacts`, base units) to a parsed hardware string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal, cast

from ..errors import MeshConfigError
from .catalogue import Fact, catalogue_key, host_memory_per_device
from .given import GIVEN, Given, given_facts
from .gpu_targets import device_hbm, gpu_pool_fraction
from .strings import HardwareSpec, parse_hardware

Platform = Literal["tpu", "gpu", "cpu"]


@dataclass(frozen=True)
class PlatformTraits:
    """What sets one platform apart, each trait named for what it changes."""

    platform: Platform
    unit: str  # what one catalogue row counts: "chip", "GPU" or "device"
    granule: str  # what one granule of `granule="auto"` is called
    compiler: str  # whose compiler the compile-only devices run
    fused_attention: str  # jax's fused attention kernel here: "splash", "cudnn" or "xla"
    # jax's Pallas kernels for TPU (Mosaic: splash attention, megablox grouped matmuls) run here.
    mosaic_kernels: bool
    # How the dropless experts' grouped matmuls run (workload/kernels.py): "libtpu" (jax's
    # ragged_dot, which libtpu groups for the forward pass and the input gradient; its weight
    # gradient is a dense masked matmul over every expert), "tokamax" (its grouped kernels for
    # all three passes; XLA's GPU compiler would make ragged_dot dense) or "dense" (every
    # expert over every row, as XLA's CPU compiler lowers ragged_dot).
    grouped_matmul: str
    # Rows of one tile of that grouped kernel: the tile that straddles two groups' boundary is
    # computed for each, so every group adds up to one (tokamax 0.0.12's sm90 heuristic
    # block_m; 0 where the time model's calibration already holds the kernel's).
    grouped_tile_rows: int
    # The kernels pick their variant from the process's own device (tokamax: the default
    # device's compute capability; jax's cuDNN attention: whether the backend is CUDA), so
    # compiling for compile-only devices must present the target as that device.
    kernels_read_own_device: bool
    # How the capacity path's tokens reach their slots in the program the estimate prices: by
    # one-hot "einsum"s (MaxText's dropping runs, the TPU calibration set) or by "index" (the
    # reference step's scatter and gather, memory-bound: what a GPU step is refereed by).
    capacity_dispatch: str
    catalogue_facts: tuple[str, ...]  # the facts the catalogue gives per unit
    # TPU slices are granules joined over DCN: a hardware string may end in a slice count, and
    # jax's and AXLearn's hybrid meshes take slices (elsewhere processes) as granules.
    multislice: bool
    # GPUs sit in NVLink domains of one or more hosts; jax names a device's domain in its
    # slice_index.
    nvlink_domains: bool
    # A device has memory of its own (HBM); CPU devices share their host's.
    device_memory: bool
    # TPU memory holds arrays in whole tiles (the catalogue's memory_tile).
    tiled_memory: bool
    # libtpu refuses a program that exceeds its HBM and its own check counts what fits; XLA's
    # GPU compiler never refuses, so a GPU step is judged by its figures against the pool.
    compiler_judges_fit: bool
    # jax's GPU client preallocates a share of the GPU's memory as the pool a step runs in.
    preallocated_pool: bool
    # libtpu reduces data-parallel gradients after the layer loop, so the step holds a
    # compute-dtype copy of them (and, across slices, the embedding tables' gradients); XLA's
    # GPU compiler reduces each layer's inside the loop body (shared HLO: A3 7B, 4 layers).
    holds_reduced_gradients: bool
    # TPU host-offload copies run beside their own pass's compute; on GPU they wait
    # (measured on an H200: benchmarks/bench_gpu_step.py).
    offload_overlaps_compute: bool
    # The backward pass of a fully recomputed layer holds one sublayer's intermediates at a
    # time (the compiler's live ranges at the peak): libtpu's, and XLA's GPU compiler's (its
    # heap at the peak of GPT-3 175B's layer loop, one H200 compile-only: the MLP's recompute
    # beside the attention's residuals, not the whole layer's intermediates twice).
    one_sublayer_at_a_time: bool
    # libtpu also holds the weights one sublayer at a time (that sublayer's gathered and their
    # gradient, the other's gathered ahead); XLA's GPU compiler holds the whole layer's
    # weights gathered twice (prefetch) and once as their gradient before it is reduced.
    sublayer_weights: bool
    # Whether the count one sublayer at a time holds over a tensor axis: on GPU, where XLA runs
    # the tensor collectives in line, a layer cut over one holds more at its peak than one
    # sublayer's intermediates (compile-only H100/H200: LLaMA-3 70B at fsdp 64 x tensor 8 0.75
    # of the compiled step so counted, GPT-3 175B and Mistral 7B at tensor 8 0.93 and 0.88), so
    # there the whole layer's are counted as before.
    sublayer_over_tensor_axis: bool
    # With one layer XLA's loop simplifier removes the layer scan, and XLA's GPU compiler then
    # fuses each weight's compute-dtype gradient into its optimizer update: no float32 set of
    # gradient shards is held (GPT-3 175B cut to one layer, one H200 compile-only: a 12.95 GB
    # temp block with no float32 gradient in it; with two layers the scan's float32 gradient
    # stacks are all live). Not measured on libtpu.
    fuses_unlooped_gradients: bool
    # XLA's GPU compiler lays the routed experts' stacked parameters out a second time for the
    # whole step, so that each layer's slice gathers over fsdp as one block (fsdp shards their
    # d_model, not their slice's major dim): f32[layers, E, d / fsdp, f] copied as
    # [d / fsdp, layers, E, f] (Mixtral 8x7B over fsdp 8, compiled for H200s: XLA's heap).
    relayouts_experts: bool
    # libtpu overlaps most tensor-parallel collectives with matmuls: the backward pass's
    # gathers as async collective fusions, one reduce-scatter a pass as a windowed (collective)
    # matmul; only the forward's and the recompute's gathers and the other reductions wait
    # (a tensor-16 step, full and dots remat). XLA's GPU compiler runs them in line.
    overlaps_tensor_collectives: bool
    # The step gathers the q, k and v weights again for their input gradient where it
    # recomputes the projections, as MaxText's does: libtpu otherwise holds the recompute's
    # gathered copies through the MLP's backward (0.9 GB on GPT-3 175B at fsdp 256). Not
    # measured on GPU, where the step keeps them (its memory model was fitted so).
    regathers_attention_weights: bool

    def compile_options(self, dump_dir: str) -> dict[str, Any] | None:
        """Options for `Lowered.compile`: where the compiler judges fit (libtpu), a dump
        directory, into which it writes its buffer assignment's memory report (what its own
        HBM check counts)."""
        return {"xla_dump_to": dump_dir} if self.compiler_judges_fit else None


_TRAITS: dict[Platform, PlatformTraits] = {
    "tpu": PlatformTraits(
        platform="tpu",
        unit="chip",
        granule="slice",
        compiler="libtpu",
        fused_attention="splash",
        mosaic_kernels=True,
        grouped_matmul="libtpu",
        grouped_tile_rows=0,
        kernels_read_own_device=False,
        capacity_dispatch="einsum",
        catalogue_facts=("hbm", "peak_bf16", "ici_bandwidth", "dcn_bandwidth"),
        multislice=True,
        nvlink_domains=False,
        device_memory=True,
        tiled_memory=True,
        compiler_judges_fit=True,
        preallocated_pool=False,
        holds_reduced_gradients=True,
        offload_overlaps_compute=True,
        one_sublayer_at_a_time=True,
        sublayer_weights=True,
        sublayer_over_tensor_axis=True,
        fuses_unlooped_gradients=False,
        relayouts_experts=False,
        overlaps_tensor_collectives=True,
        regathers_attention_weights=True,
    ),
    "gpu": PlatformTraits(
        platform="gpu",
        unit="GPU",
        granule="NVLink domain",
        compiler="XLA's CUDA client",
        fused_attention="cudnn",
        mosaic_kernels=False,
        grouped_matmul="tokamax",
        grouped_tile_rows=64,
        kernels_read_own_device=True,
        capacity_dispatch="index",
        catalogue_facts=("hbm", "peak_bf16", "nvlink_bandwidth", "network_per_gpu"),
        multislice=False,
        nvlink_domains=True,
        device_memory=True,
        tiled_memory=False,
        compiler_judges_fit=False,
        preallocated_pool=True,
        holds_reduced_gradients=False,
        offload_overlaps_compute=False,
        one_sublayer_at_a_time=True,
        sublayer_weights=False,
        sublayer_over_tensor_axis=False,
        fuses_unlooped_gradients=True,
        relayouts_experts=True,
        overlaps_tensor_collectives=False,
        regathers_attention_weights=False,
    ),
    "cpu": PlatformTraits(
        platform="cpu",
        unit="device",
        granule="process",
        compiler="XLA's CPU client",
        fused_attention="xla",
        mosaic_kernels=False,
        grouped_matmul="dense",
        grouped_tile_rows=0,
        kernels_read_own_device=False,
        capacity_dispatch="index",
        catalogue_facts=(),
        multislice=False,
        nvlink_domains=False,
        device_memory=False,
        tiled_memory=False,
        compiler_judges_fit=False,
        preallocated_pool=False,
        holds_reduced_gradients=False,
        offload_overlaps_compute=False,
        one_sublayer_at_a_time=False,
        sublayer_weights=False,
        sublayer_over_tensor_axis=False,
        fuses_unlooped_gradients=False,
        relayouts_experts=False,
        overlaps_tensor_collectives=False,
        regathers_attention_weights=False,
    ),
}


def platform_traits(platform: str) -> PlatformTraits:
    """The traits of a platform as jax names it ("tpu", "gpu"); any other platform's devices
    are plain devices in processes, as CPU's are."""
    return _TRAITS.get(cast(Platform, platform), _TRAITS["cpu"])


def attention_kernel(kind: str, platform: str) -> str:
    """What attention of `kind` runs as on `platform`: "plain" stays plain; otherwise jax's
    fused kernel there ("splash" on TPU, "cudnn" on GPU, "xla" elsewhere)."""
    return "plain" if kind == "plain" else platform_traits(platform).fused_attention


@dataclass(frozen=True)
class DeviceFacts:
    """One JAX device of a hardware string, as the cost model sees it (base units)."""

    hardware: str
    traits: PlatformTraits = field(repr=False)
    peak_flops: float  # bf16 FLOP/s of one device
    hbm_bytes: float  # what one device may use
    hbm_bandwidth: float | None  # bytes/s between one device and its HBM
    ici_bandwidth: float | None  # bytes/s one way over one ICI/NVLink link of a ring
    ici_latency: float | None  # seconds per ring step inside a granule
    dcn_bandwidth: float | None  # bytes/s one device has across granules (host NICs shared)
    dcn_latency: float | None  # seconds per ring step across granules
    tile: tuple[int, int] | None  # TPU memory tile (rows of 4-byte words, lanes), else None
    host_memory_bytes: float | None = None  # host memory one device may fill with offloads
    host_link_bandwidth: float | None = None  # bytes/s between a device and its host, each way
    mxu: tuple[int, int] | None = None  # TPU matrix unit (rows, columns); None where not known
    # Measured shares of the peak that a layer's matmuls and the fused attention kernels reach
    # on this chip (GPU; configs/hardware.toml), None where not measured (the time model then
    # takes the platform's calibrated compute_efficiency).
    matmul_share: float | None = None
    attention_share: float | None = None
    memory_share: float | None = None  # of HBM bandwidth, by the time model's byte count
    grouped_matmul_share: float | None = None  # of the peak, the dropless experts' kernel
    given: Given = ()  # the catalogue facts the user set for this run (hardware/given.py)

    @property
    def platform(self) -> Platform:
        return self.traits.platform

    def need(self, name: str) -> float:
        """A fact the estimate needs: its value, or an error naming what is missing."""
        value = getattr(self, name)
        if value is None:
            raise MeshConfigError(
                f"hardware={self.hardware!r}: the catalogue has no {name.replace('_', ' ')} "
                "(configs/hardware.toml), which this estimate needs; accepted: hardware whose "
                "entry has it (`loadax-mesh hardware`), or the fact given for the run "
                "(--fact NAME=VALUE, facts={...}; its catalogue name per platform: "
                "hardware/given.py)"
            )
        return float(value)


@dataclass(frozen=True)
class HardwareProfile:
    """A catalogue hardware string, resolved once: the parsed string, its platform's traits
    and, where the catalogue has a peak and an HBM size, one device's facts."""

    spec: HardwareSpec = field(repr=False)
    traits: PlatformTraits = field(repr=False)
    device: DeviceFacts | None = field(repr=False)
    missing: str | None = field(repr=False)  # the fact that keeps `device` None

    @property
    def hardware(self) -> str:
        return self.spec.hardware

    @property
    def platform(self) -> Platform:
        return self.traits.platform

    def facts(self) -> DeviceFacts:
        """One device's facts, or an error naming the fact the catalogue lacks."""
        if self.device is None:
            raise MeshConfigError(
                f"hardware={self.hardware!r}: the catalogue has no {self.missing}, which every "
                "estimate needs; accepted: hardware whose entry has it (`loadax-mesh hardware`)"
            )
        return self.device

    def facts_for(self, devices: int) -> DeviceFacts:
        """One device's facts where `devices` devices make up the hardware: libtpu's
        compile-only v4 devices are TensorCores, twice the megacore devices the catalogue
        counts, each with half of its chip's memory, peak and HBM bandwidth."""
        facts, share = self.facts(), self.spec.num_devices / devices
        if share >= 1:
            return facts
        bandwidth = None if facts.hbm_bandwidth is None else facts.hbm_bandwidth * share
        return replace(
            facts,
            hbm_bytes=facts.hbm_bytes * share,
            peak_flops=facts.peak_flops * share,
            hbm_bandwidth=bandwidth,
        )


def hardware_profile(
    hardware: str, facts: Mapping[str, str | float] | None = None
) -> HardwareProfile:
    """The profile of a catalogue hardware string (a MeshConfigError names what is valid), with
    `facts` the user gives for the run in place of the catalogue's (hardware/given.py)."""
    given: Given = ()
    if facts:
        given = given_facts(facts, platform=parse_hardware(hardware).platform, hardware=hardware)
    # a GPU's memory is the pool jax sizes; the facts are the catalogue's read now (user.py)
    return _profile(hardware, gpu_pool_fraction()[0], catalogue_key(), given)


@cache
def _profile(
    hardware: str, pool_fraction: float, _catalogue: object, given: Given
) -> HardwareProfile:
    spec = parse_hardware(hardware)
    traits = platform_traits(spec.platform)
    device, missing = _device_facts(spec, traits, given)
    return HardwareProfile(spec=spec, traits=traits, device=device, missing=missing)


def catalogue_profile(
    hardware: str | None, facts: Mapping[str, str | float] | None = None
) -> HardwareProfile | None:
    """The profile of a hardware string, or None where it names no catalogue hardware (bad
    `facts` for one it names raise)."""
    if hardware is None:
        return None
    try:
        profile = hardware_profile(hardware)
    except MeshConfigError:
        return None
    return hardware_profile(hardware, facts) if facts else profile


def _device_facts(
    spec: HardwareSpec, traits: PlatformTraits, given: Given = ()
) -> tuple[DeviceFacts | None, str | None]:
    """The facts of one device of `spec` (TPU: a chip or TensorCore; GPU: a GPU), or None
    and the name of the missing fact; a fact in `given` in place of the catalogue's."""
    per_chip = spec.devices_per_chip
    by_user = {g.name: Fact(g.value, (GIVEN,), g.unit) for g in given}

    def fact(name: str) -> Fact | None:
        return by_user.get(name) or spec.fact(name)

    def base(name: str, divide: float = 1.0) -> float | None:
        found = fact(name)
        return None if found is None or found.base is None else found.base / divide

    peak = base("peak_bf16", per_chip)
    hbm = device_hbm(spec.type)
    if peak is None or hbm is None:
        return None, "peak_bf16" if peak is None else "hbm"
    common = dict(
        hardware=spec.hardware,
        traits=traits,
        peak_flops=peak,
        hbm_bytes=hbm,
        host_memory_bytes=host_memory_per_device(spec.type),
        host_link_bandwidth=base("host_link_bandwidth", per_chip),
        given=given,
    )
    if traits.tiled_memory:  # a TPU: ICI links of its torus, DCN shared by a host's chips
        return DeviceFacts(
            **common,  # type: ignore[arg-type]
            hbm_bandwidth=base("hbm_bandwidth", per_chip),
            ici_bandwidth=base("ici_link_bandwidth"),
            ici_latency=base("ici_latency"),
            dcn_bandwidth=base("dcn_bandwidth", per_chip),
            dcn_latency=base("dcn_latency"),
            tile=_pair(spec, "memory_tile"),
            mxu=_pair(spec, "mxu"),
        ), None
    # NVLink through NVSwitch: a ring step moves at half a GPU's bidirectional NVLink bandwidth.
    return DeviceFacts(
        **common,  # type: ignore[arg-type]
        hbm_bandwidth=base("hbm_bandwidth"),
        ici_bandwidth=base("nvlink_bandwidth", 2.0),
        ici_latency=base("nvlink_latency"),
        dcn_bandwidth=base("network_per_gpu"),
        dcn_latency=base("network_latency"),
        tile=None,
        matmul_share=_share(fact("matmul_share")),
        attention_share=_share(fact("attention_share")),
        memory_share=_share(fact("memory_share")),
        grouped_matmul_share=_share(fact("grouped_matmul_share")),
    ), None


def _share(fact: Fact | None) -> float | None:
    """A dimensionless catalogue fact (a share of the peak), None where not known."""
    return None if fact is None or fact.value is None else float(fact.value)


def _pair(spec: HardwareSpec, name: str) -> tuple[int, int] | None:
    """A catalogue fact of two ints (a memory tile, a matrix unit), None where not known."""
    fact = spec.fact(name)
    return None if fact is None or fact.value is None else (int(fact.value[0]), int(fact.value[1]))
