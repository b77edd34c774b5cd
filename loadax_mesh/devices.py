"""One normal form for a device set: real jax devices and stand-ins are read the same way.

A device is anything with `id`, `platform`, `device_kind`, `process_index` and, optionally,
`slice_index`, `coords` and `core_on_chip` (read only on TPU: a GPU's `coords` holds its local
device id, which is no torus position). Each device's attributes are read once; everything
after that is numpy array work.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from .errors import MeshConfigError

GranuleSpec = str | Callable[[Any], Hashable]
GRANULE_MODES = ("auto", "slice", "process", "none")


@dataclass(frozen=True)
class SimulatedDevice:
    """A stand-in for a jax device, with the attributes JAX's own devices carry."""

    id: int
    platform: str
    device_kind: str
    process_index: int
    slice_index: int | None = None
    coords: tuple[int, ...] | None = None
    core_on_chip: int = 0


@dataclass(frozen=True, eq=False)
class DeviceTable:
    """The attributes of every device, as arrays indexed like `devices`."""

    devices: np.ndarray  # object array of the devices as given
    ids: np.ndarray
    process_index: np.ndarray
    slice_index: np.ndarray | None  # None when any device lacks it
    platform: str
    device_kind: str
    coords: np.ndarray | None  # (n, d) chip positions on TPU, else None
    core_on_chip: np.ndarray | None

    def __len__(self) -> int:
        return len(self.ids)


_READ_ALL = attrgetter("id", "process_index", "platform", "device_kind")


def read_devices(devices: Sequence[Any]) -> DeviceTable:
    """Read a device set once into a DeviceTable; reject empty, mixed or duplicated sets."""
    devs = list(devices.flat) if isinstance(devices, np.ndarray) else list(devices)
    if not devs:
        raise MeshConfigError("devices=[] is empty; accepted: one or more devices")
    try:
        ids, procs, platforms, kinds = zip(*map(_READ_ALL, devs), strict=True)
    except AttributeError as err:
        raise MeshConfigError(
            f"devices: {err}; accepted: objects with id, platform, device_kind, process_index"
        ) from None
    if len(set(platforms)) > 1 or len(set(kinds)) > 1:
        raise MeshConfigError(
            f"devices mix platforms {sorted(set(platforms))} / kinds {sorted(set(kinds))}; "
            "accepted: one kind of device"
        )
    id_arr = np.asarray(ids, dtype=np.int64)
    if len(np.unique(id_arr)) != len(id_arr):
        raise MeshConfigError("devices hold a device id more than once; accepted: distinct devices")
    slices = [getattr(d, "slice_index", None) for d in devs]
    slice_arr = None if any(s is None for s in slices) else np.asarray(slices, dtype=np.int64)
    coords = cores = None
    if platforms[0] == "tpu" and all(getattr(d, "coords", None) is not None for d in devs):
        coords = np.asarray([d.coords for d in devs], dtype=np.int64)
        cores = np.asarray([getattr(d, "core_on_chip", 0) for d in devs], dtype=np.int64)
    array = np.empty(len(devs), dtype=object)
    array[:] = devs
    return DeviceTable(array, id_arr, np.asarray(procs, dtype=np.int64), slice_arr,
                       platforms[0], kinds[0], coords, cores)


def granule_keys(table: DeviceTable, granule: GranuleSpec) -> tuple[np.ndarray, str]:
    """Per device, the index (in sorted key order) of its granule, and the kind of granule.

    `auto`: TPU takes `slice_index` when it has two or more values, else one granule; GPU takes
    `slice_index` when it has two or more values (one per NVLink domain), else `process_index`;
    other platforms take `process_index`.
    """
    if callable(granule):
        keys = [granule(d) for d in table.devices]
        try:
            order = sorted(set(keys))
        except TypeError:
            raise MeshConfigError(
                "granule: the callable returned keys that cannot be sorted; accepted: a "
                "callable returning comparable hashable keys (ints, strings, tuples)"
            ) from None
        index = {k: i for i, k in enumerate(order)}
        return np.fromiter((index[k] for k in keys), dtype=np.int64, count=len(keys)), "custom"
    if granule not in GRANULE_MODES:
        raise MeshConfigError(
            f"granule={granule!r}; accepted: {', '.join(GRANULE_MODES)}, or a callable "
            "device -> hashable"
        )
    kind = granule
    if granule == "auto":
        several_slices = table.slice_index is not None and len(np.unique(table.slice_index)) > 1
        if table.platform == "tpu":
            kind = "slice" if several_slices else "none"
        elif table.platform == "gpu":
            kind = "slice" if several_slices else "process"
        else:
            kind = "process"
    if kind == "none":
        return np.zeros(len(table), dtype=np.int64), kind
    if kind == "slice":
        if table.slice_index is None:
            raise MeshConfigError(
                "granule='slice' but the devices have no slice_index; accepted here: 'process', "
                "'none', 'auto' or a callable"
            )
        values = table.slice_index
    else:
        values = table.process_index
    return np.unique(values, return_inverse=True)[1].astype(np.int64), kind
