"""One normal form for a device set: real jax devices and stand-ins are read the same way.

A device is anything with `id`, `platform`, `device_kind`, `process_index` and, optionally,
`slice_index`, `coords` and `core_on_chip` (read only on TPU: a GPU's `coords` holds its local
device id, which is no torus position). Each device's attributes are read once; everything
after that is numpy array work.
"""

from __future__ import annotations

import itertools
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
# TPU (and most GPU) devices carry every attribute. One ufunc call reads them all into seven
# object arrays: numpy calls the getter per device with no Python iterator in between, which
# is a third faster than chaining the attribute tuples into one array.
_READ_FULL = np.frompyfunc(
    attrgetter(
        "id", "process_index", "slice_index", "core_on_chip", "platform", "device_kind", "coords"
    ),
    1,
    7,
)


def read_devices(devices: Sequence[Any]) -> DeviceTable:
    """Read a device set once into a DeviceTable; reject empty, mixed or duplicated sets."""
    devs = list(devices.flat) if isinstance(devices, np.ndarray) else devices
    n = len(devs)
    if not n:
        raise MeshConfigError("devices=[] is empty; accepted: one or more devices")
    array = np.fromiter(devs, object, n)
    try:
        *numbers, platforms, kinds, coords = _READ_FULL(array)
        ids, procs, slices, cores = (column.astype(np.int64) for column in numbers)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return _read_each(devs)  # some attribute missing or None (CPU, GPU without slices)
    platform, kind = _one_kind(platforms, kinds)
    _distinct_ids(ids)
    chips = None
    if platform == "tpu":
        try:
            chips = _coords(coords, _slice_length(slices))
        except TypeError:  # a device without a chip position
            return _read_each(devs)
    return DeviceTable(
        array, ids, procs, slices, platform, kind, chips, cores if chips is not None else None
    )


def _read_each(devs: Sequence[Any]) -> DeviceTable:
    """The general reader: attributes beyond id, platform, device_kind and process_index are
    optional (`slice_index` is kept only when every device has one)."""
    try:
        ids, procs, platforms, kinds = zip(*map(_READ_ALL, devs), strict=True)
    except AttributeError as err:
        raise MeshConfigError(
            f"devices: {err}; accepted: objects with id, platform, device_kind, process_index"
        ) from None
    platform, kind = _one_kind(np.asarray(platforms, object), np.asarray(kinds, object))
    id_arr = _distinct_ids(np.asarray(ids, dtype=np.int64))
    slices = [getattr(d, "slice_index", None) for d in devs]
    slice_arr = None if any(s is None for s in slices) else np.asarray(slices, dtype=np.int64)
    coords = cores = None
    if platform == "tpu" and all(getattr(d, "coords", None) is not None for d in devs):
        coords = _coords([d.coords for d in devs])
        cores = np.asarray([getattr(d, "core_on_chip", 0) for d in devs], dtype=np.int64)
    return DeviceTable(
        np.fromiter(devs, object, len(devs)),
        id_arr,
        np.asarray(procs, dtype=np.int64),
        slice_arr,
        platform,
        kind,
        coords,
        cores,
    )


def _one_kind(platforms: np.ndarray, kinds: np.ndarray) -> tuple[str, str]:
    """The one platform and device kind of the set, or an error naming the mix."""
    n = len(platforms)
    if np.count_nonzero(platforms == platforms[0]) != n or np.count_nonzero(kinds == kinds[0]) != n:
        raise MeshConfigError(
            f"devices mix platforms {sorted(set(platforms))} / kinds {sorted(set(kinds))}; "
            "accepted: one kind of device"
        )
    return platforms[0], kinds[0]


def _distinct_ids(ids: np.ndarray) -> np.ndarray:
    """`ids`, checked for repeats (a mark per id when they span a small range, else a sort)."""
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 4 * len(ids):
        marks = np.zeros(hi - lo + 1, np.int8)
        marks[ids - lo] = 1
        repeated = int(marks.sum()) != len(ids)
    else:
        ordered = np.sort(ids)
        repeated = bool((ordered[1:] == ordered[:-1]).any())
    if repeated:
        raise MeshConfigError("devices hold a device id more than once; accepted: distinct devices")
    return ids


def _slice_length(slices: np.ndarray) -> int:
    """Devices per slice when the devices come slice by slice in equal runs (as JAX lists
    them), else 0."""
    starts = np.flatnonzero(slices[1:] != slices[:-1]) + 1
    if not len(starts):
        return 0
    length = int(starts[0])
    if len(slices) % length or not np.array_equal(starts, np.arange(length, len(slices), length)):
        return 0
    return length


def _coords(coords: Any, period: int = 0) -> np.ndarray:
    """The chip positions as an (n, d) int array; all must have the same number of dims (checked
    by the total count: one pass over the devices is all this reader allows itself).

    When every slice of `period` devices lists the same positions in the same order (the usual
    case), only the first slice's are converted: comparing the rest costs a third as much.
    """
    n = len(coords)
    if period and isinstance(coords, np.ndarray):
        blocks = coords.reshape(-1, period)
        if bool((blocks[1:] == blocks[:1]).all()):
            first = _coords(blocks[0])
            tiled = np.empty((n // period, *first.shape), np.int64)
            tiled[:] = first
            return tiled.reshape(n, -1)
    d = len(coords[0])
    flat = np.fromiter(itertools.chain.from_iterable(coords), np.int64)
    if flat.size != n * d:
        raise MeshConfigError(
            f"devices have coords of different lengths (first: {tuple(coords[0])}); "
            "accepted: one chip position of the same length per TPU device"
        )
    return flat.reshape(n, d)


def granule_keys(table: DeviceTable, granule: GranuleSpec) -> tuple[np.ndarray, str]:
    """Per device, the index (in sorted key order) of its granule, and the kind of granule.

    `auto`: TPU takes `slice_index` when it has two or more values, else one granule; GPU takes
    `slice_index` when it has two or more values (one per NVLink domain), else `process_index`;
    other platforms take `process_index`.
    """
    if callable(granule):
        keys: list[Any] = [granule(d) for d in table.devices]
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
        several_slices = table.slice_index is not None and bool(
            table.slice_index.min() != table.slice_index.max()
        )
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
    return dense_rank(values), kind


def dense_rank(values: np.ndarray) -> np.ndarray:
    """Per value, its index among the distinct values in sorted order (np.unique's inverse,
    by marking when the values span a small range)."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo >= 4 * len(values):
        return np.unique(values, return_inverse=True)[1].astype(np.int64).reshape(-1)
    present = np.zeros(hi - lo + 1, np.int64)
    present[values - lo] = 1
    return (np.cumsum(present) - 1)[values - lo]
