"""Detection: the hardware string that names a set of real or simulated devices.

`detect_hardware` reads the devices once (devices.py) and asks the catalogue which entry they
form; the string it returns is what `mesh_rules` are matched against. Pure Python and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .catalogue import HardwareType, catalogue, tpu_type_of_kind
from .devices import DeviceTable, SimulatedDevices, read_devices
from .errors import MeshConfigError


def detect_hardware(devices: Sequence[Any] | None = None) -> str:
    """The hardware string for real or simulated devices (default `jax.devices()`).

    Round-trips: `detect_hardware(simulate_devices(h)) == h` for every catalogue string. A TPU
    slice whose chip count the catalogue does not list still gets its string (rules can match
    it; `simulate_devices` rejects it). GPU instance types that share a device kind cannot be
    told apart: the first catalogue entry with the devices' kind, hosts and domains is named.
    """
    if devices is None:
        import jax

        devices = jax.devices()
    if isinstance(devices, SimulatedDevices):
        return devices.hardware
    table = read_devices(devices)
    if table.platform == "tpu":
        return _detect_tpu(table)
    if table.platform == "gpu":
        return _detect_gpu(table)
    if table.platform == "cpu":
        procs, per = _per_process(table, "cpu")
        return f"cpu-{per}" if procs == 1 else f"cpu-{procs}x{per}"
    raise MeshConfigError(
        f"devices: platform {table.platform!r} is not in the catalogue; "
        "accepted: tpu, gpu, cpu (pass selector= to plan anyway)"
    )


def _per_process(table: DeviceTable, what: str) -> tuple[int, int]:
    counts = np.unique(table.process_index, return_counts=True)[1]
    if counts.min() != counts.max():
        raise MeshConfigError(
            f"devices: {what} processes hold different device counts "
            f"{sorted(set(counts.tolist()))}; accepted: equal processes"
        )
    return len(counts), int(counts[0])


def _slices(table: DeviceTable) -> tuple[np.ndarray, int]:
    if table.slice_index is None:
        return np.zeros(len(table), dtype=np.int64), 1
    inverse = np.unique(table.slice_index, return_inverse=True)[1].astype(np.int64)
    counts = np.bincount(inverse)
    if counts.min() != counts.max():
        raise MeshConfigError(
            f"devices: slices hold different device counts "
            f"{sorted(set(counts.tolist()))}; accepted: equal slices"
        )
    return inverse, len(counts)


def _detect_tpu(table: DeviceTable) -> str:
    t = tpu_type_of_kind(table.device_kind)
    if t is None:
        kinds = [k for x in catalogue().types if x.platform == "tpu" for k in x.device_kinds]
        raise MeshConfigError(
            f"devices: TPU device_kind {table.device_kind!r} is not in the "
            f"catalogue; accepted: {kinds} (pass selector= to plan anyway)"
        )
    slice_ids, slices = _slices(table)
    if table.coords is not None:
        keys = np.column_stack([slice_ids, table.coords - table.coords.min(axis=0)])
        chips = len(np.unique(np.ravel_multi_index(keys.T, tuple(keys.max(axis=0) + 1))))
    else:
        chips = len(table) // t.devices_per_chip
    count = chips // slices * (t.cores_per_chip if t.count_unit == "tensorcores" else 1)
    return f"tpu-{t.key}-{count}" + (f"-{slices}" if slices > 1 else "")


def _detect_gpu(table: DeviceTable) -> str:
    kind, n = table.device_kind, len(table)
    gpus = [t for t in catalogue().types if t.platform == "gpu"]
    candidates = [t for t in gpus if t.device_kind == kind]
    if not candidates:
        raise MeshConfigError(
            f"devices: GPU device_kind {kind!r} is not in the catalogue; "
            f"accepted: {sorted({t.device_kind for t in gpus})} (pass "
            "selector= to plan anyway)"
        )
    _, slices = _slices(table)
    hosts = len(np.unique(table.process_index))

    def valid(t: HardwareType) -> bool:
        d = t.nvlink_domain
        return n % t.devices_per_host == 0 and (n <= d or n % d == 0)

    def fits(t: HardwareType) -> bool:
        return hosts * t.devices_per_host == n and min(n, t.nvlink_domain) * slices == n

    best = next((t for t in candidates if valid(t) and fits(t)), None)
    best = best or next((t for t in candidates if valid(t)), None)
    if best is None:
        raise MeshConfigError(
            f"devices: {n} {kind!r} GPUs are no whole hosts of "
            f"{sorted({t.key: t.devices_per_host for t in candidates}.items())}; pass selector="
        )
    return f"gpu-{best.key}-{n}"
