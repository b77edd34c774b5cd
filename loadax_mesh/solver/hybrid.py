"""Granules and DCN assembly: from a device table and a resolved hybrid shape to a device grid.

Along mesh axis `i` a device's index is `dcn_index * ici[i] + ici_index`: the granule is the
major part, as in `jax.experimental.mesh_utils.create_hybrid_device_mesh`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from ..errors import MeshConfigError
from ..hardware.devices import DeviceTable
from ..hardware.tori import wraparound
from ..shapes import HybridMeshShape
from .torus import solve_torus

_log = logging.getLogger("loadax_mesh")


@dataclass(frozen=True, eq=False)
class Torus:
    """The physical ICI graph of one TPU granule (every granule has the same one)."""

    chip_shape: tuple[int, ...]
    wrap: tuple[bool, ...]
    cores_per_chip: int
    host_block: tuple[int, ...] | None = None  # one process's box of chips, if they tile
    # Per ICI axis: does its ring keep each process's devices consecutive? (None: no box.)
    host_contiguous: tuple[bool | None, ...] = ()


@dataclass(frozen=True, eq=False)
class Layout:
    """Where every device sits: `index` is mesh-shaped and holds rows of the device table."""

    index: np.ndarray
    granule: np.ndarray  # per table row, its granule number (sorted key order)
    num_granules: int
    torus: Torus | None


def granule_sizes(granule: np.ndarray) -> tuple[int, int]:
    """(number of granules, devices per granule); unequal granules are an error."""
    counts = np.bincount(granule)
    if counts.min() != counts.max():
        raise MeshConfigError(
            f"granules hold different numbers of devices ({sorted(set(counts.tolist()))}); "
            "accepted: granules of equal size (choose granule='none' or a callable)"
        )
    return len(counts), int(counts[0])


def layout_devices(table: DeviceTable, granule: np.ndarray, shape: HybridMeshShape) -> Layout:
    """Order the devices of every granule along the ICI shape and assemble the DCN grid."""
    num_granules, per_granule = granule_sizes(granule)
    ici, dcn = shape.ici_mesh_shape, shape.dcn_mesh_shape
    if math.prod(dcn) != num_granules or math.prod(ici) != per_granule:
        raise MeshConfigError(
            f"{shape} needs {math.prod(dcn)} granules of {math.prod(ici)} devices but the devices "
            f"form {num_granules} granules of {per_granule}"
        )
    torus = None
    members = None
    if table.coords is not None:
        torus, members = _torus_members(table, granule, num_granules, ici)
        if members is None:
            _log.warning(
                "loadax_mesh: the TPU chips of each granule do not fill one box of the same "
                "shape, so devices are ordered by (process_index, id), not along torus rings"
            )
    if members is None:
        members = np.lexsort((table.ids, table.process_index, granule)).reshape(num_granules, -1)
    return Layout(assemble(members, ici, dcn), granule, num_granules, torus)


def assemble(members: np.ndarray, ici: tuple[int, ...], dcn: tuple[int, ...]) -> np.ndarray:
    """`members[g]` holds granule g's devices in ICI order; lay granules out on the DCN grid."""
    n = len(ici)
    grid = members.reshape(*dcn, *ici)
    interleave = [k for i in range(n) for k in (i, n + i)]
    return grid.transpose(interleave).reshape([d * c for d, c in zip(dcn, ici, strict=True)])


def _torus_members(
    table: DeviceTable, granule: np.ndarray, num_granules: int, ici: tuple[int, ...]
) -> tuple[Torus | None, np.ndarray | None]:
    """Each granule's devices in torus-ring order, or (None, None) if the chips form no box."""
    assert table.coords is not None and table.core_on_chip is not None
    n = len(granule)
    dims = np.ascontiguousarray(table.coords.T)  # (d, n): reductions run along memory
    cores = table.core_on_chip
    if num_granules == 1 or bool((granule[1:] >= granule[:-1]).all()):
        by_granule = np.arange(n).reshape(num_granules, -1)  # listed granule by granule
    else:
        by_granule = np.argsort(granule, kind="stable").reshape(num_granules, -1)
        dims, cores = dims[:, by_granule.ravel()], cores[by_granule.ravel()]
    dims = dims.reshape(len(dims), num_granules, -1)  # (d, G, per granule)
    cores = cores.reshape(num_granules, -1)
    origin, top = dims.min(axis=2, keepdims=True), dims.max(axis=2, keepdims=True)
    extent = top - origin
    chip_shape = tuple(int(x) + 1 for x in extent.max(axis=(1, 2)))
    if not (extent == extent[:, :1]).all():
        return None, None  # granules of different chip shapes
    cores_per_chip = int(cores.max()) + 1
    full = (*chip_shape, cores_per_chip)
    if math.prod(full) != by_granule.shape[1] or int(cores.min()) < 0:
        return None, None  # holes: the chips do not fill a box
    # Flat slot of every device: its granule's block, then its position in the box.
    per = by_granule.shape[1]
    slot = cores + np.arange(0, n, per).reshape(-1, 1)
    for k in range(len(chip_shape)):
        slot += (dims[k] - origin[k]) * math.prod(full[k + 1 :])
    flat_slots = np.full(n, -1, np.int64)
    flat_slots[slot.reshape(-1)] = by_granule.reshape(-1)
    slots = flat_slots.reshape(num_granules, per)
    if (slots < 0).any():
        return None, None  # two devices at one position
    wrap = wraparound(table.device_kind, chip_shape)
    block = _host_block(table.process_index[slots].reshape(num_granules, *full))
    solution = solve_torus(
        chip_shape, ici, wrap=wrap, cores_per_chip=cores_per_chip, host_block=block
    )
    torus = Torus(chip_shape, wrap, cores_per_chip, block, solution.host_contiguous)
    return torus, slots[:, solution.order.ravel()]


def _host_block(owner: np.ndarray) -> tuple[int, ...] | None:
    """The box of chips each process holds, when the processes tile every granule in equal,
    aligned boxes of whole chips; else None (then no ring is asked to keep processes together).

    `owner` is (granule, *chip_shape, cores): the process of every device position.
    """
    first = owner[(0,) * owner.ndim]
    held = np.nonzero(owner[0] == first)
    box = tuple(int(c.max()) + 1 for c in held[:-1])  # the box starts at the granule's corner
    per_chip = owner.shape[-1]
    if len(held[0]) != math.prod(box) * per_chip or any(
        n % b for n, b in zip(owner.shape[1:-1], box, strict=True)
    ):
        return None
    tiles = owner.reshape(
        len(owner),
        *(x for n, b in zip(owner.shape[1:-1], box, strict=True) for x in (n // b, b)),
        per_chip,
    )
    corner = tiles[(slice(None), *((slice(None), slice(0, 1)) * len(box)), slice(0, 1))]
    if not (tiles == corner).all():
        return None  # a box holds two processes
    owners = corner.ravel()
    low, high = int(owners.min()), int(owners.max())
    if low >= 0 and high < 8 * owners.size:  # dense process indices: count them, no sort
        twice = int(np.bincount(owners).max()) > 1
    else:
        twice = np.unique(owners).size != owners.size
    return None if twice else box  # a process holding two boxes is no host block
