"""Detection: the hardware string that names a set of real or simulated devices.

`detect_hardware` reads the devices once (devices.py) and asks the catalogue which entry they
form; the string it returns is what `mesh_rules` are matched against. Devices the catalogue
does not list (a GPU kind it lacks, a workstation with 1, 2 or 4 GPUs, a job cut down with
CUDA_VISIBLE_DEVICES) get a generic selector built from what they say, so detection never
stops a plan. Pure Python and numpy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .catalogue import HardwareType, tpu_type_of_kind, types_of_kind
from .devices import DeviceTable, SimulatedDevices, dense_rank, read_devices
from .words import count_text


def detect_hardware(devices: Sequence[Any] | None = None) -> str:
    """The hardware string for real or simulated devices (default `jax.devices()`).

    The catalogue's name where the devices form one of its entries: whole hosts of a GPU
    instance type in whole NVLink domains, a TPU slice (also of a chip count the catalogue does
    not list), CPU processes of equal size. Round-trips: `detect_hardware(simulate_devices(h))
    == h` for every catalogue string; GPU instance types that share a device kind cannot be
    told apart, so the first catalogue entry that fits is named (a user catalogue's entries
    first: `load_catalogue`). Otherwise the generic selector
    `<platform>-<device kind>-<devices>` (`generic_selector`), e.g. `gpu-nvidia-h100-80gb-hbm3-1`.

    Args:
        devices: the devices to name (default `jax.devices()`).

    Returns:
        The hardware string, as mesh rules match it.

    Raises:
        MeshConfigError: no devices, or objects without a device's attributes.
    """
    if devices is None:
        import jax

        devices = jax.devices()
    if isinstance(devices, SimulatedDevices):
        return devices.hardware
    return name_devices(read_devices(devices))


def name_devices(table: DeviceTable) -> str:
    """The catalogue's string for devices already read, else their generic selector."""
    name, _ = match_catalogue(table)
    return name or generic_selector(table)


def generic_selector(table: DeviceTable) -> str:
    """`<platform>-<device kind>-<devices>` for devices no catalogue entry names: the kind in
    lower case with every run of other characters than letters and digits made one `-`
    ('NVIDIA GeForce RTX 4090', 4 devices: `gpu-nvidia-geforce-rtx-4090-4`)."""
    kind = re.sub(r"[^a-z0-9]+", "-", table.device_kind.lower()).strip("-") or "unknown"
    return f"{table.platform}-{kind}-{len(table)}"


def match_catalogue(table: DeviceTable) -> tuple[str | None, str]:
    """(the catalogue's string for the devices, or None; why none, or "")."""
    platform, kind = table.platform, table.device_kind
    if platform == "tpu":
        t = tpu_type_of_kind(kind)
        if t is None:
            return None, f"TPU device_kind {kind!r} is not in the catalogue"
        return _tpu_name(table, t)
    if platform == "gpu":
        return _gpu_name(table)
    if platform == "cpu":
        counts = np.bincount(dense_rank(table.process_index))
        if counts.min() != counts.max():
            return None, f"CPU processes hold different device counts {_sizes(counts)}"
        procs, per = len(counts), int(counts[0])
        return (f"cpu-{per}" if procs == 1 else f"cpu-{procs}x{per}"), ""
    return None, f"platform {platform!r} is not in the catalogue (tpu, gpu, cpu)"


def _tpu_name(table: DeviceTable, t: HardwareType) -> tuple[str | None, str]:
    if table.slice_index is None:
        slice_ids, slices = np.zeros(len(table), np.int64), 1
    else:
        slice_ids = dense_rank(table.slice_index)
        counts = np.bincount(slice_ids)
        if counts.min() != counts.max():
            return None, f"TPU slices hold different device counts {_sizes(counts)}"
        slices = len(counts)
    if table.coords is not None:
        keys = np.column_stack([slice_ids, table.coords - table.coords.min(axis=0)])
        chips = len(np.unique(np.ravel_multi_index(keys.T, tuple(keys.max(axis=0) + 1))))
    else:
        chips = len(table) // t.devices_per_chip
    count = chips // slices * (t.cores_per_chip if t.count_unit == "tensorcores" else 1)
    return f"tpu-{t.key}-{count}" + (f"-{slices}" if slices > 1 else ""), ""


def _gpu_name(table: DeviceTable) -> tuple[str | None, str]:
    """The first GPU instance type of the devices' kind whose whole hosts they are: every
    process inside one host, and every slice_index one NVLink domain (or one host, as XLA
    before fabric detection numbered them)."""
    kind, n = table.device_kind, len(table)
    candidates = types_of_kind("gpu", kind)
    if not candidates:
        return None, f"GPU device_kind {kind!r} is not in the catalogue"
    per_process = np.bincount(dense_rank(table.process_index))
    per_slice = None if table.slice_index is None else np.bincount(dense_rank(table.slice_index))
    for t in candidates:
        host, domain = t.devices_per_host, t.nvlink_domain
        if not t.whole_gpu_hosts(n) or (host % per_process).any():
            continue
        if per_slice is None or (per_slice == min(n, domain)).all() or (per_slice == host).all():
            return f"gpu-{t.key}-{n}", ""
    groups: dict[tuple[int, int], list[str]] = {}
    for t in candidates:
        groups.setdefault((t.devices_per_host, t.nvlink_domain), []).append(t.key)
    shapes = " or ".join(
        f"hosts of {h} GPUs{f' in NVLink domains of {d}' if d > h else ''} ({', '.join(keys)})"
        for (h, d), keys in groups.items()
    )
    domains = "" if per_slice is None else f", {count_text(len(per_slice), 'slice_index value')}"
    procs = count_text(len(per_process), "process", "es")
    return None, f"{count_text(n, 'GPU')} ({procs}{domains}): not whole {shapes}"


def _sizes(counts: np.ndarray) -> list[int]:
    return sorted(set(counts.tolist()))
