"""Hardware strings: parsed against the catalogue (configs/hardware.toml) and simulated.

Strings follow AXLearn's mesh selectors: `tpu-<generation>-<count>[-<slices>]`,
`gpu-<instance type>-<GPUs>`, `cpu-<N>` (one process) and `cpu-<P>x<K>` (P processes of K).
A TPU count maps to the one slice topology the catalogue lists for it (for v5p the published
table, e.g. 512 TensorCores -> 4x8x8 chips). Everything here is pure Python and numpy: planning
simulated hardware never imports jax. Detection (strings for real devices) lives in detect.py
and the wraparound rule in catalogue.py; both are re-exported here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import MeshConfigError
from .catalogue import (
    Fact,
    HardwareType,
    Topology,
    catalogue,
    list_hardware,
)
from .detect import detect_hardware
from .devices import SimulatedDevice, SimulatedDevices
from .tori import wrap_rule, wraparound

__all__ = [
    "Fact",
    "HardwareSpec",
    "HardwareType",
    "Topology",
    "detect_hardware",
    "list_hardware",
    "parse_hardware",
    "simulate_devices",
    "wraparound",
]

_ALIASES = {"v5e": "v5litepod", "tpu7x": "7x", "v7x": "7x", "ironwood": "7x", "trillium": "v6e"}


@dataclass(frozen=True)
class HardwareSpec:
    """A parsed hardware string: what `simulate_devices` builds and the CLI describes."""

    hardware: str  # the canonical string
    type: HardwareType
    num_devices: int
    chips: int  # TPU chips; GPUs; CPU devices
    devices_per_chip: int
    hosts: int  # processes
    devices_per_host: int
    slices: int  # TPU slices; GPU NVLink domains (JAX's slice_index); 1 on CPU
    devices_per_slice: int
    topology: tuple[int, ...]  # TPU: one slice's chips per dim (2D on v5e/v6e); else ()
    host_block: tuple[int, ...]  # TPU: one host's chips per dim; else ()
    wrap: tuple[bool, ...]  # TPU: which topology dims close into rings; else ()

    @property
    def platform(self) -> str:
        return self.type.platform

    @property
    def device_kind(self) -> str:
        return self.type.device_kind

    @property
    def topology_name(self) -> str:
        return "x".join(map(str, self.topology))

    @property
    def granules(self) -> int:
        """How many granules `granule="auto"` forms on these devices (docs/design.md section 3)."""
        return self.slices if self.platform in ("tpu", "gpu") else self.hosts

    def fact(self, name: str) -> Fact | None:
        return self.type.fact(name)

    def summary(self) -> str:
        """One line: chips, topology, devices, hosts, slices."""
        unit = (
            "GPUs" if self.platform == "gpu" else "chips" if self.platform == "tpu" else "devices"
        )
        shape = f" ({self.topology_name} per slice)" if self.topology else ""
        per_chip = (
            f", {self.devices_per_chip} devices per chip" if self.devices_per_chip > 1 else ""
        )
        granule = "NVLink domain" if self.platform == "gpu" else "slice"
        return (
            f"{self.hardware}: {self.type.title}, {self.chips} {unit}{shape}{per_chip}, "
            f"{self.hosts} host{'s' * (self.hosts != 1)}, {self.slices} {granule}"
            f"{'s' * (self.slices != 1)}"
        )


# -- parsing -----------------------------------------------------------------------------------

_TPU = re.compile(r"tpu-(?P<key>[a-z0-9]+)-(?P<count>\d+)(?:-(?P<slices>\d+))?")
_GPU = re.compile(r"gpu-(?P<key>.+)-(?P<count>\d+)")
_CPU = re.compile(r"cpu-(?:(?P<procs>\d+)x)?(?P<count>\d+)")
_ACCEPTED = (
    "accepted: tpu-<generation>-<count>[-<slices>] (e.g. tpu-v5p-512, "
    "tpu-v5litepod-256-4), gpu-<instance type>-<GPUs> (e.g. gpu-p5.48xlarge-256), "
    "cpu-<N> or cpu-<P>x<K>; see `loadax-mesh hardware`"
)


def _number(text: str | None, hardware: str, what: str) -> int:
    if text is None or not re.fullmatch(r"[1-9]\d*", text):
        raise MeshConfigError(
            f"hardware={hardware!r}: {what}={text!r}; accepted: a positive integer without "
            "leading zeros"
        )
    return int(text)


def catalogue_spec(hardware: str | None) -> HardwareSpec | None:
    """The catalogue's HardwareSpec for a hardware string, or None when it names none."""
    try:
        return None if hardware is None else parse_hardware(hardware)
    except MeshConfigError:
        return None


def parse_hardware(hardware: str) -> HardwareSpec:
    """Parse a hardware string against the catalogue; errors list what is valid."""
    if not isinstance(hardware, str):
        raise MeshConfigError(f"hardware={hardware!r} is not a string; {_ACCEPTED}")
    for regex, parse in ((_TPU, _parse_tpu), (_GPU, _parse_gpu), (_CPU, _parse_cpu)):
        match = regex.fullmatch(hardware)
        if match:
            return parse(hardware, match)
    raise MeshConfigError(f"hardware={hardware!r} is not a hardware string; {_ACCEPTED}")


def _parse_tpu(hardware: str, m: re.Match[str]) -> HardwareSpec:
    cat = catalogue()
    key = m["key"]
    t = cat.get("tpu", key)
    if t is None:
        hint = f" (write {_ALIASES[key]!r})" if key in _ALIASES else ""
        raise MeshConfigError(
            f"hardware={hardware!r}: unknown TPU generation {key!r}{hint}; "
            f"accepted: {', '.join(cat.keys('tpu'))}"
        )
    count = _number(m["count"], hardware, "count")
    topo = next((x for x in t.topologies if x.count == count), None)
    if topo is None:
        listed = ", ".join(f"{x.count} ({x.name})" for x in t.topologies)
        raise MeshConfigError(
            f"hardware={hardware!r}: {count} {t.count_unit} is no {key} slice in the catalogue; "
            f"accepted counts ({t.count_unit}): {listed}"
        )
    slices = 1
    if m["slices"] is not None:
        slices = _number(m["slices"], hardware, "slices")
        if slices == 1:
            raise MeshConfigError(
                f"hardware={hardware!r}: one slice is written without a slice "
                f"suffix; accepted: 'tpu-{key}-{count}' or a suffix >= 2"
            )
        if t.multislice is False:
            raise MeshConfigError(
                f"hardware={hardware!r}: TPU {key} has no multislice in the "
                f"catalogue; accepted: 'tpu-{key}-{count}'"
            )
    chips = math.prod(topo.shape)
    per_host = math.prod(topo.host) * t.devices_per_chip
    return HardwareSpec(
        hardware=hardware,
        type=t,
        num_devices=chips * t.devices_per_chip * slices,
        chips=chips * slices,
        devices_per_chip=t.devices_per_chip,
        hosts=chips // math.prod(topo.host) * slices,
        devices_per_host=per_host,
        slices=slices,
        devices_per_slice=chips * t.devices_per_chip,
        topology=topo.shape,
        host_block=topo.host,
        wrap=wrap_rule(t.wraparound_rule, topo.shape),
    )


def _parse_gpu(hardware: str, m: re.Match[str]) -> HardwareSpec:
    cat = catalogue()
    t = cat.get("gpu", m["key"])
    if t is None:
        raise MeshConfigError(
            f"hardware={hardware!r}: unknown GPU instance type {m['key']!r}; "
            f"accepted: {', '.join(cat.keys('gpu'))}"
        )
    n = _number(m["count"], hardware, "count")
    per_host, domain = t.devices_per_host, t.nvlink_domain
    if not t.whole_gpu_hosts(n):
        within = (
            f"{per_host}, {2 * per_host}, ..., {domain} (whole hosts of {per_host} in one "
            f"NVLink domain) or "
            if domain > per_host
            else ""
        )
        raise MeshConfigError(
            f"hardware={hardware!r}: {n} GPUs are not whole hosts of {per_host} and whole NVLink "
            f"domains of {domain}; accepted: {within}a multiple of {domain}"
        )
    per_slice = min(n, domain)
    return HardwareSpec(
        hardware=hardware,
        type=t,
        num_devices=n,
        chips=n,
        devices_per_chip=1,
        hosts=n // per_host,
        devices_per_host=per_host,
        slices=n // per_slice,
        devices_per_slice=per_slice,
        topology=(),
        host_block=(),
        wrap=(),
    )


def _parse_cpu(hardware: str, m: re.Match[str]) -> HardwareSpec:
    t = catalogue().get("cpu", "cpu")
    assert t is not None
    per = _number(m["count"], hardware, "devices")
    procs = 1 if m["procs"] is None else _number(m["procs"], hardware, "processes")
    if m["procs"] is not None and procs == 1:
        raise MeshConfigError(
            f"hardware={hardware!r}: one process is written 'cpu-{per}'; "
            "accepted: cpu-<N> or cpu-<P>x<K> with P >= 2"
        )
    return HardwareSpec(
        hardware=hardware,
        type=t,
        num_devices=procs * per,
        chips=procs * per,
        devices_per_chip=1,
        hosts=procs,
        devices_per_host=per,
        slices=1,
        devices_per_slice=procs * per,
        topology=(),
        host_block=(),
        wrap=(),
    )


# -- simulation --------------------------------------------------------------------------------


def simulate_devices(hardware: str | HardwareSpec) -> SimulatedDevices:
    """Stand-in devices for a hardware string, listed as JAX lists them (host by host).

    TPU: ids row-major over chip coords (x fastest) then core, slice by slice, as in JAX's own
    mesh tests; `coords` are 3-tuples (z = 0 on 2D generations); `slice_index` only when there
    are several slices, as on libtpu's devices. GPU: ids grouped by host, `slice_index` per
    NVLink domain, `coords = (domain, host in domain, local GPU)` as jax's GPU devices carry
    them. CPU: no slice_index, no coords.

    Args:
        hardware: a catalogue hardware string such as "tpu-v5p-512", "gpu-p5.48xlarge-16" or
            "cpu-2x4" (`loadax-mesh hardware` lists them).

    Returns:
        The devices, each with `id`, `platform`, `device_kind`, `process_index` and, where the
        hardware has them, `slice_index`, `coords` and `core_on_chip`.

    Raises:
        MeshConfigError: not a hardware string, or a size the catalogue does not offer.
    """
    spec = hardware if isinstance(hardware, HardwareSpec) else parse_hardware(hardware)
    devices = SimulatedDevices(_simulate(spec))
    devices.hardware = spec.hardware
    return devices


def _simulate(spec: HardwareSpec) -> list[SimulatedDevice]:
    if spec.platform == "tpu":
        return _simulate_tpu(spec)
    kind, n = spec.device_kind, spec.num_devices
    ids = np.arange(n)
    procs = (ids // spec.devices_per_host).tolist()
    ids_list = ids.tolist()
    if spec.platform == "gpu":
        # coords (domain, host in domain, local GPU) as one (n, 3) array, then tuples
        per_host, per_slice = spec.devices_per_host, spec.devices_per_slice
        grid = np.column_stack([ids // per_slice, ids % per_slice // per_host, ids % per_host])
        coords = list(map(tuple, grid.tolist()))
        return [
            SimulatedDevice(i, "gpu", kind, p, c[0], c, 0)
            for i, p, c in zip(ids_list, procs, coords, strict=True)
        ]
    return [SimulatedDevice(i, "cpu", kind, p) for i, p in zip(ids_list, procs, strict=True)]


def _simulate_tpu(spec: HardwareSpec) -> list[SimulatedDevice]:
    shape = (*spec.topology, 1, 1)[:3]
    block = (*spec.host_block, 1, 1)[:3]
    hosts = tuple(s // b for s, b in zip(shape, block, strict=True))
    cores = spec.devices_per_chip
    # Listing order: slice, host (z, y, x), chip in host (z, y, x), core.
    grid = (spec.slices, hosts[2], hosts[1], hosts[0], block[2], block[1], block[0], cores)
    s, zp, yp, xp, zd, yd, xd, core = (a.ravel() for a in np.indices(grid).reshape(8, -1))
    x, y, z = xd + block[0] * xp, yd + block[1] * yp, zd + block[2] * zp
    ids = core + cores * (x + shape[0] * (y + shape[1] * (z + shape[2] * s)))
    procs = xp + hosts[0] * (yp + hosts[1] * (zp + hosts[2] * s))
    coords = zip(x.tolist(), y.tolist(), z.tolist(), strict=True)
    kind = spec.device_kind
    # One slice: no slice_index, as libtpu's devices (and JAX's single-slice TpuDevice) have.
    slices = s.tolist() if spec.slices > 1 else [None] * len(s)
    return [
        SimulatedDevice(i, "tpu", kind, p, sl, c, k)
        for i, p, sl, c, k in zip(
            ids.tolist(), procs.tolist(), slices, coords, core.tolist(), strict=True
        )
    ]
