"""How faithful the simulation is: `simulate_devices` against the compile-only devices.

For one hardware string, every attribute the planner reads is compared device by device in
listing order (as the device reader gives it to the planner and, on GPU, also as the devices
carry it, since the reader derives the NVLink domain from it), and the planner's answer (mesh as
physical positions, ring quality) is compared on both sets for a few presets. A difference is
either listed in `KNOWN` with its reason or a defect of the simulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hardware.devices import DeviceTable, read_devices
from ..hardware.strings import list_hardware, parse_hardware, simulate_devices
from ..hardware.topology import DIFFERENCES
from ..hardware.traits import platform_traits

ATTRIBUTES = ("count", "device_kind", "process_index", "slice_index", "coords", "core_on_chip")
RAW = ("slice_index", "coords")  # GPU: compared as the devices carry them, too ("raw ...")
PRESETS = ("fsdp", "fsdp_tp", "hsdp")

# (generation or platform, attribute) -> why the compile-only devices differ from the stand-ins.
KNOWN = {
    ("v4", "count"): "libtpu lists v4 TensorCores (2 per chip) where jax on a real v4 host "
    "lists one megacore device per chip; libtpu takes no megacore option. Compared on "
    "core 0: every other attribute agrees",
    ("v4", "ids"): "libtpu's ids count TensorCores (see count)",
    ("v4", "plan"): "twice the devices (see count), so meshes of the same preset differ",
    ("tpu", "ids"): "libtpu numbers multislice devices 100000 * (slice + 1) + i; the stand-ins "
    "count on (as JAX's mesh tests do). The planner orders TPU devices by slice, coords and core, "
    "never by id, so plans agree position for position",
    ("gpu", "raw slice_index"): f"{DIFFERENCES['gpu']}; the stand-ins carry the domain as "
    "jax's real devices do, so the slice_index the planner reads agrees",
}


def catalogue_strings(platform: str = "tpu") -> list[str]:
    """Every catalogue example of `platform`, and for TPU two multislice strings per entry that
    has them (a small slice times 4, a large one times 2), for GPU a partial NVLink domain of
    two hosts where a domain spans several (a rack of GB200 hosts)."""
    strings: list[str] = []
    for t in list_hardware():
        if t.platform != platform:
            continue
        strings += t.examples
        if platform_traits(platform).multislice and t.multislice is not False:
            strings += [f"{t.examples[1]}-4", f"{t.examples[-2]}-2"]
        if t.nvlink_domain > 2 * t.devices_per_host:  # a GPU type whose domain spans hosts
            strings.append(f"gpu-{t.key}-{2 * t.devices_per_host}")
    return strings


@dataclass(frozen=True)
class Fidelity:
    """One hardware string: the attributes that differ and whether plans agree."""

    hardware: str
    simulated: int  # device counts
    compiled: int
    differences: tuple[str, ...]  # attribute names, "ids" and "plan:<preset>" included
    reasons: tuple[str, ...]  # per difference: its KNOWN reason, or "" (a defect)

    @property
    def unexplained(self) -> tuple[str, ...]:
        return tuple(d for d, r in zip(self.differences, self.reasons, strict=True) if not r)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "simulated": self.simulated,
            "compiled": self.compiled,
            "differences": dict(zip(self.differences, self.reasons, strict=True)),
        }


def compare(hardware: str, compiled: Any = None) -> Fidelity:
    """Compare `simulate_devices(hardware)` with its compile-only devices (default
    `topology_devices(hardware)`)."""
    if compiled is None:
        from ..hardware.topology import topology_devices

        compiled = topology_devices(hardware)
    spec = parse_hardware(hardware)
    simulated = simulate_devices(spec)
    sim, real = read_devices(simulated), read_devices(compiled)
    differences = []
    if len(sim) != len(real):
        differences.append("count")
        real = read_devices(_first_cores(compiled, real))
    differences += [a for a in ATTRIBUTES[1:] if not _same(getattr(sim, a), getattr(real, a))]
    differences += ["ids"] * (not np.array_equal(sim.ids, real.ids))
    if platform_traits(spec.platform).nvlink_domains:
        differences += [f"raw {a}" for a in RAW if _carried(simulated, a) != _carried(compiled, a)]
    if "count" in differences:
        differences.append("plan")
    else:
        differences += [f"plan:{p}" for p in PRESETS if not _same_plan(p, simulated, compiled)]
    key = spec.type.key
    reasons = tuple(
        KNOWN.get((key, d.split(":")[0])) or KNOWN.get((spec.platform, d), "") for d in differences
    )
    return Fidelity(hardware, len(simulated), len(compiled), tuple(differences), reasons)


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b)) if isinstance(a, np.ndarray) else a == b


def _carried(devices: Any, name: str) -> list[Any]:
    """An attribute as the devices carry it (sequences as lists)."""
    values = [getattr(d, name, None) for d in devices]
    return [list(v) if isinstance(v, tuple | list) else v for v in values]


def _first_cores(devices: Any, table: DeviceTable) -> list[Any]:
    """The devices on core 0 of their chip (to compare the rest where counts differ)."""
    cores = table.core_on_chip if table.core_on_chip is not None else np.zeros(len(table))
    return [d for d, c in zip(devices, cores.tolist(), strict=True) if c == 0]


def positions(plan: Any) -> np.ndarray:
    """Per mesh position, the physical place of its device: (slice, *coords, core) on TPU,
    (slice, process, rank in process) elsewhere."""
    table = plan.table
    n = len(table)
    slices = table.slice_index if table.slice_index is not None else np.zeros(n, np.int64)
    if table.coords is not None and table.core_on_chip is not None:
        place = np.column_stack([slices, table.coords, table.core_on_chip])
    else:
        order = np.lexsort((table.ids, table.process_index))
        rank = np.empty(n, np.int64)
        starts = np.searchsorted(table.process_index[order], table.process_index[order])
        rank[order] = np.arange(n) - starts
        place = np.column_stack([slices, table.process_index, rank])
    return place[plan.layout.index]


def _same_plan(preset: str, simulated: Any, compiled: Any) -> bool:
    from ..config import MeshConfig

    config = MeshConfig.from_preset(preset)
    hardware = simulated.hardware
    a = config.plan(simulated, selector=hardware)
    b = config.plan(compiled, selector=hardware)
    return (
        (a.ici_mesh_shape, a.dcn_mesh_shape) == (b.ici_mesh_shape, b.dcn_mesh_shape)
        and np.array_equal(positions(a), positions(b))
        and a.quality() == b.quality()
    )
