"""The catalogue facts the cost model reads, per JAX device, in base units (bytes, seconds).

Every number comes from configs/hardware.toml with its source; a fact the estimate needs but
the catalogue lacks is a `MeshConfigError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MeshConfigError
from ..hardware.catalogue import host_memory_per_device
from ..hardware.gpu_targets import device_hbm
from ..hardware.strings import HardwareSpec


@dataclass(frozen=True)
class DeviceFacts:
    """One JAX device of a hardware string, as the cost model sees it."""

    hardware: str
    platform: str
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

    def need(self, name: str) -> float:
        """A fact the estimate needs: its value, or an error naming what is missing."""
        value = getattr(self, name)
        if value is None:
            raise MeshConfigError(
                f"hardware={self.hardware!r}: the catalogue has no {name.replace('_', ' ')} "
                "(configs/hardware.toml), which this estimate needs; accepted: hardware whose "
                "entry has it (`loadax-mesh hardware`)"
            )
        return float(value)


def device_facts(spec: HardwareSpec) -> DeviceFacts:
    """The facts of one device of `spec` (TPU: a chip or TensorCore; GPU: a GPU)."""
    per_chip = spec.devices_per_chip

    def base(name: str, divide: float = 1.0) -> float | None:
        fact = spec.fact(name)
        return None if fact is None or fact.base is None else fact.base / divide

    peak = base("peak_bf16", per_chip)
    host = {
        "host_memory_bytes": host_memory_per_device(spec.type),
        "host_link_bandwidth": base("host_link_bandwidth", per_chip),
    }
    hbm = device_hbm(spec.type)
    if peak is None or hbm is None:
        missing = "peak_bf16" if peak is None else "hbm"
        raise MeshConfigError(
            f"hardware={spec.hardware!r}: the catalogue has no {missing}, which every estimate "
            "needs; accepted: hardware whose entry has it (`loadax-mesh hardware`)"
        )
    if spec.platform == "tpu":
        return DeviceFacts(
            hardware=spec.hardware,
            platform="tpu",
            peak_flops=peak,
            hbm_bytes=hbm,
            hbm_bandwidth=base("hbm_bandwidth", per_chip),
            ici_bandwidth=base("ici_link_bandwidth"),
            ici_latency=base("ici_latency"),
            dcn_bandwidth=base("dcn_bandwidth", per_chip),
            dcn_latency=base("dcn_latency"),
            tile=_tile(spec),
            **host,
        )
    # NVLink through NVSwitch: a ring step moves at half a GPU's bidirectional NVLink bandwidth.
    nvlink = base("nvlink_bandwidth", 2.0)
    return DeviceFacts(
        hardware=spec.hardware,
        platform=spec.platform,
        peak_flops=peak,
        hbm_bytes=hbm,
        hbm_bandwidth=base("hbm_bandwidth"),
        ici_bandwidth=nvlink,
        ici_latency=base("nvlink_latency"),
        dcn_bandwidth=base("network_per_gpu"),
        dcn_latency=base("network_latency"),
        tile=None,
        **host,
    )


def _tile(spec: HardwareSpec) -> tuple[int, int] | None:
    fact = spec.fact("memory_tile")
    return None if fact is None else (int(fact.value[0]), int(fact.value[1]))
