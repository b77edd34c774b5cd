"""The hardware profile: a hardware string resolved once into what the wings above read.

`HardwareProfile` adds its platform's traits (traits.py) and the catalogue's facts of one
device (`DeviceFacts`, base units) to a parsed hardware string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache

from ..errors import MeshConfigError
from .catalogue import Fact, catalogue_key, host_memory_per_device
from .given import GIVEN, Given, given_facts
from .gpu_targets import device_hbm, gpu_pool_fraction
from .strings import HardwareSpec, parse_hardware
from .traits import Platform, PlatformTraits, platform_traits

# The catalogue's name of a DeviceFacts field on a platform where it is not the field's own
# (what _device_facts reads it from)
CATALOGUE_NAMES = {
    "tpu": {"ici_bandwidth": "ici_link_bandwidth"},
    "gpu": {
        "ici_bandwidth": "nvlink_bandwidth",
        "ici_latency": "nvlink_latency",
        "dcn_bandwidth": "network_per_gpu",
        "dcn_latency": "network_latency",
    },
}


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
    # Dense low-precision FLOP/s of one device (TrainSpec.quantization), None where its chip
    # has no such matrix units or no source gives the rate; and where measured, the share of
    # that peak a quantized projection or MLP matmul reaches (else the time model's calibrated
    # `quantized_share`, cost/calibration.py).
    peak_fp8: float | None = None
    peak_int8: float | None = None
    fp8_matmul_share: float | None = None
    int8_matmul_share: float | None = None

    @property
    def platform(self) -> Platform:
        return self.traits.platform

    def matmul_peak(self, quantization: str) -> float:
        """The FLOP/s a matmul of `quantization` ("none": the compute dtype's, bf16) peaks
        at on this device; an error naming the precision, the hardware and what it accepts
        where the catalogue has no such peak."""
        if quantization == "none":
            return self.peak_flops
        peak = getattr(self, f"peak_{quantization}")
        if peak is None:
            accepted = ["none"] + [q for q in ("fp8", "int8") if getattr(self, f"peak_{q}")]
            raise MeshConfigError(
                f"quantization={quantization!r} on hardware={self.hardware!r}: the catalogue "
                f"has no peak_{quantization} for it (its chip has no {quantization} matrix "
                f"units, or no source gives their rate); accepted: {', '.join(accepted)}, or "
                f"the fact given for the run (--fact peak_{quantization}=VALUE)"
            )
        return float(peak)

    def quantized_share(self, quantization: str) -> float | None:
        """The measured share of `quantization`'s peak a quantized matmul reaches, None where
        not measured."""
        found: float | None = getattr(self, f"{quantization}_matmul_share")
        return found

    def need(self, name: str) -> float:
        """A fact the estimate needs: its value, or an error naming what is missing by the
        catalogue's name of it on this platform (`nvlink_latency` for a GPU's ici_latency)."""
        value = getattr(self, name)
        if value is None:
            fact = CATALOGUE_NAMES.get(self.platform, {}).get(name, name)
            raise MeshConfigError(
                f"hardware={self.hardware!r}: the catalogue has no {fact} for it, which this "
                "estimate needs; accepted: hardware whose entry has it (`loadax-mesh "
                f"hardware`), or the fact given for the run (--fact {fact}=VALUE, or "
                f"facts={{{fact!r}: ...}})"
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
        fp8, int8 = facts.peak_fp8, facts.peak_int8
        return replace(
            facts,
            hbm_bytes=facts.hbm_bytes * share,
            peak_flops=facts.peak_flops * share,
            hbm_bandwidth=bandwidth,
            peak_fp8=None if fp8 is None else fp8 * share,
            peak_int8=None if int8 is None else int8 * share,
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
        peak_fp8=base("peak_fp8", per_chip),
        peak_int8=base("peak_int8", per_chip),
        fp8_matmul_share=_share(fact("fp8_matmul_share")),
        int8_matmul_share=_share(fact("int8_matmul_share")),
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
