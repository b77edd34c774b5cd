"""One normal form for a device set: real jax devices and stand-ins are read the same way.

A device is anything with `id`, `platform`, `device_kind`, `process_index` and, optionally,
`slice_index`, `coords` and `core_on_chip` (chip positions are used only on TPU: a GPU's
`coords` are (NVLink domain, host in the domain, local GPU), or (local GPU,) on older jax, no
torus position). Each device's attributes are read once, by one ufunc call; everything after
that is numpy array work.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from ..errors import MeshConfigError

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


class SimulatedDevices(list[SimulatedDevice]):
    """The stand-ins of one hardware string; `hardware` names it, so detection is exact even
    where device sets alike (H100 nodes of p5 and a3-mega) cannot be told apart."""

    hardware: str


@dataclass(frozen=True, eq=False)
class DeviceTable:
    """The attributes of every device, as arrays indexed like `devices`."""

    devices: np.ndarray  # object array of the devices as given
    ids: np.ndarray
    process_index: np.ndarray
    slice_index: np.ndarray | None  # None when any device lacks it; GPU: see _gpu_domains
    platform: str
    device_kind: str
    coords: np.ndarray | None  # (n, d) chip positions on TPU, else None
    core_on_chip: np.ndarray | None

    def __len__(self) -> int:
        return len(self.ids)


_REQUIRED = ("id", "process_index", "platform", "device_kind")
_OPTIONAL = ("slice_index", "core_on_chip", "coords")


def read_devices(devices: Sequence[Any]) -> DeviceTable:
    """Read a device set once into a DeviceTable; reject empty, mixed or duplicated sets.

    The optional attributes the first device has are read from all of them; one that another
    device lacks or holds as None counts as absent.
    """
    if isinstance(devices, np.ndarray):
        array = devices.astype(object).reshape(-1)  # a copy: the table owns its devices
    else:
        array = np.fromiter(devices, object, len(devices))
    if not len(array):
        raise MeshConfigError("devices=[] is empty; accepted: one or more devices")
    optional = [a for a in _OPTIONAL if getattr(array[0], a, None) is not None]
    columns = _read(array, optional)
    platform, kind = _one_kind(columns["platform"].tolist(), columns["device_kind"].tolist())
    ids = _distinct_ids(_ints(columns["id"], "id"))
    slices = _optional_ints(columns.get("slice_index"), "slice_index")
    if platform == "gpu" and "coords" in columns and slices is not None:
        slices = _gpu_domains(slices, columns["coords"])
    chips = cores = None
    if platform == "tpu" and "coords" in columns:
        chips = _coords(columns["coords"], _slice_length(slices) if slices is not None else 0)
    if chips is not None:
        cores = _optional_ints(columns.get("core_on_chip"), "core_on_chip")
        cores = np.zeros(len(array), np.int64) if cores is None else cores
    procs = _ints(columns["process_index"], "process_index")
    return DeviceTable(array, ids, procs, slices, platform, kind, chips, cores)


def _read(array: np.ndarray, optional: Sequence[str]) -> dict[str, np.ndarray]:
    """The required and the given optional attributes of every device, as object columns; an
    optional attribute some device lacks is left out."""
    try:
        return _columns(array, (*_REQUIRED, *optional))
    except AttributeError:
        pass
    try:
        columns = _columns(array, _REQUIRED)
    except AttributeError as err:
        raise MeshConfigError(
            f"devices: {err}; accepted: objects with {', '.join(_REQUIRED)} (and optionally "
            f"{', '.join(_OPTIONAL)})"
        ) from None
    for name in optional:
        with contextlib.suppress(AttributeError):
            columns |= _columns(array, (name,))
    return columns


def _columns(array: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """One ufunc call reads the named attributes of every device: numpy calls the getter per
    device with no Python iterator in between, a third faster than chaining attribute tuples."""
    out = np.frompyfunc(attrgetter(*names), 1, len(names))(array)
    return dict(zip(names, out if len(names) > 1 else (out,), strict=True))


def _ints(column: np.ndarray, field: str) -> np.ndarray:
    """An object column as int64. The first device's value must be an int: numpy's cast, fast
    enough for every device, would also turn "3" or 2.5 into an int, so a stand-in class that
    uses another type is caught by its first device."""
    try:
        if _is_int64(column[0]):
            return column.astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    bad = next((v for v in column.tolist() if not _is_int64(v)), column[0])
    raise MeshConfigError(
        f"devices: a device has {field}={bad!r}; accepted: an int for every device"
    )


def _optional_ints(column: np.ndarray | None, field: str) -> np.ndarray | None:
    """`_ints`, or None when the column is absent or a device has None there."""
    if column is None:
        return None
    try:
        return _ints(column, field)
    except MeshConfigError:
        if any(v is None for v in column.tolist()):
            return None
        raise


def _is_int64(value: Any) -> bool:
    return isinstance(value, int | np.integer) and bool(-(2**63) <= value < 2**63)


def _one_kind(platforms: list[Any], kinds: list[Any]) -> tuple[str, str]:
    """The one platform and device kind of the set, or an error naming the mix (list.count
    compares by identity first: faster than an object-array compare)."""
    n = len(platforms)
    if platforms.count(platforms[0]) != n or kinds.count(kinds[0]) != n:
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


def _gpu_domains(slices: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Per GPU, its NVLink domain (XLA's partition). jax's GPU devices carry coords (partition,
    host in partition, local GPU) and slice_index = partition; XLA's compile-only devices carry
    the same coords but slice_index 0 in every partition. So where slice_index has one value
    and coords have three entries, the domain is coords[0]; otherwise slice_index stands (older
    jax's coords are (local GPU,))."""
    if slices.min() != slices.max():
        return slices
    try:
        table = _coords(coords)
    except MeshConfigError:  # coords of mixed lengths: not jax's, and not read on GPU
        return slices
    return table[:, 0].copy() if table is not None and table.shape[1] == 3 else slices


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


def _coords(coords: np.ndarray, period: int = 0) -> np.ndarray | None:
    """The chip positions as an (n, d) int array, or None when a device has none; all must have
    the same number of dims (checked by the total count: one pass is all this allows itself).

    When every slice of `period` devices lists the same positions in the same order (the usual
    case), only the first slice's are converted: comparing the rest costs a third as much.
    """
    n = len(coords)
    if period:
        blocks = coords.reshape(-1, period)
        if bool((blocks[1:] == blocks[:1]).all()):
            first = _coords(blocks[0])
            if first is None:
                return None
            tiled = np.empty((n // period, *first.shape), np.int64)
            tiled[:] = first
            return tiled.reshape(n, -1)
    try:
        d = len(coords[0])
        flat = np.fromiter(itertools.chain.from_iterable(coords), np.int64)
    except TypeError:
        if any(c is None for c in coords.tolist()):
            return None
        raise MeshConfigError(
            "devices: a device's coords is no sequence of ints; accepted: one chip position "
            "(a tuple of ints) per TPU device"
        ) from None
    if flat.size != n * d:
        raise MeshConfigError(
            f"devices have coords of different lengths (first: {tuple(coords[0])}); "
            "accepted: one chip position of the same length per TPU device"
        )
    return flat.reshape(n, d)


def granule_keys(table: DeviceTable, granule: GranuleSpec) -> tuple[np.ndarray, str]:
    """Per device, the index (in sorted key order) of its granule, and the kind of granule.

    `auto`: TPU takes `slice_index` when it has two or more values, else one granule; GPU takes
    `slice_index` whenever the devices carry it (one value per NVLink domain: a host, or a whole
    NVL72 rack), else `process_index`; other platforms take `process_index`.
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
        slices = table.slice_index
        if table.platform == "tpu":
            several = slices is not None and bool(slices.min() != slices.max())
            kind = "slice" if several else "none"
        elif table.platform == "gpu":
            kind = "process" if slices is None else "slice"
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
