"""Views of a mesh along some of its axes: what PyTorch `DeviceMesh` users reach for.

`axis_groups` and `process_groups` are PyTorch's per-dimension process groups, `submesh` is
`mesh["tp"]`, `flatten_axes` is `_flatten`, `coordinate` is `get_coordinate`. Everything here
is numpy work on `mesh.devices`; jax is imported only to build a new `Mesh`. The read-only
functions also take a `MeshPlan` (so they work on simulated devices).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import MeshConfigError

if TYPE_CHECKING:
    import jax

AxisNames = str | Sequence[str]


def axis_positions(mesh: Any, axes: AxisNames, *, field: str = "axes") -> tuple[int, ...]:
    """The positions of `axes` (a name or a sequence of names, order kept) among the mesh axes.

    Unknown, repeated or non-string names and an empty sequence are a MeshConfigError.
    """
    names = tuple(mesh.axis_names)
    given = (axes,) if isinstance(axes, str) else axes
    if not isinstance(given, tuple | list) or not given:
        raise MeshConfigError(
            f"{field}={axes!r} is not an axis name or a non-empty tuple of axis names; "
            f"accepted: names from {names}"
        )
    for name in given:
        if not isinstance(name, str) or name not in names:
            raise MeshConfigError(
                f"{field}={axes!r} names {name!r}, which is not a mesh axis; accepted: names "
                f"from {names}"
            )
    if len(set(given)) != len(given):
        raise MeshConfigError(f"{field}={axes!r} repeats a name; accepted: distinct axis names")
    return tuple(names.index(name) for name in given)


def _grouped(grid: np.ndarray, positions: tuple[int, ...]) -> np.ndarray:
    """`grid` as (groups, members): groups row-major over the other axes in mesh order,
    members row-major over `positions` in the order given."""
    others = [i for i in range(grid.ndim) if i not in positions]
    size = math.prod(grid.shape[i] for i in positions)
    return grid.transpose(*others, *positions).reshape(-1, size)


def axis_groups(mesh: Any, axes: AxisNames) -> list[list[Any]]:
    """Every group of devices that varies only along `axes`, in mesh order.

    On a `(2, 4)` mesh `("dp", "tp")` the `tp` groups are the rows and the `dp` groups the
    columns. Inside a group, devices run row-major over `axes` in the order given.

    Args:
        mesh: a Mesh (or anything with `devices` and `axis_names`).
        axes: an axis name or a tuple of names.

    Returns:
        The groups, each a list of devices.

    Raises:
        MeshConfigError: unknown, repeated or non-string names, or no names.
    """
    positions = axis_positions(mesh, axes)
    return [list(row) for row in _grouped(np.asarray(mesh.devices), positions)]


_PROCESS_INDEX = np.frompyfunc(operator.attrgetter("process_index"), 1, 1)


def process_grid(devices: np.ndarray) -> np.ndarray:
    """Every device's process index, shaped like `devices` (one ufunc call, no Python loop)."""
    return _PROCESS_INDEX(devices).astype(np.int64)


def process_groups(mesh: Any, axes: AxisNames) -> list[tuple[int, ...]]:
    """For each group of `axis_groups(mesh, axes)`, its distinct process indices, sorted.

    Args:
        mesh: a Mesh (or anything with `devices` and `axis_names`).
        axes: an axis name or a tuple of names.

    Returns:
        One tuple of process indices per group.

    Raises:
        MeshConfigError: as `axis_groups`.
    """
    positions = axis_positions(mesh, axes)
    rows = _grouped(process_grid(np.asarray(mesh.devices)), positions)
    ordered = np.sort(rows, axis=1)
    first = np.ones_like(ordered, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    return [tuple(int(p) for p in row[keep]) for row, keep in zip(ordered, first, strict=True)]


@functools.lru_cache(maxsize=16)
def _positions_by_id(mesh: Any) -> dict[Any, int]:
    """Device id -> flat position in the mesh, read once per mesh."""
    return {d.id: i for i, d in enumerate(np.asarray(mesh.devices).flat)}


def _position(mesh: Any, device: Any) -> tuple[int, ...]:
    devices = np.asarray(mesh.devices)
    flat = _positions_by_id(mesh).get(getattr(device, "id", None))
    if flat is not None:
        where = np.unravel_index(flat, devices.shape)
        if devices[where] == device:
            return tuple(int(i) for i in where)
    raise MeshConfigError(
        f"device={device!r} is not in the mesh; accepted: one of its {devices.size} devices "
        f"(ids {_id_summary(devices)})"
    )


def _id_summary(devices: np.ndarray) -> str:
    ids = sorted(d.id for d in devices.flat)
    return str(ids) if len(ids) <= 16 else f"{ids[:8]} ... {ids[-4:]}"


def coordinate(mesh: Any, device: Any) -> dict[str, int]:
    """`device`'s index along every mesh axis, by axis name.

    Args:
        mesh: a Mesh (or anything with `devices` and `axis_names`).
        device: a device of the mesh.

    Returns:
        Axis name -> index.

    Raises:
        MeshConfigError: `device` is not in the mesh.
    """
    return dict(zip(mesh.axis_names, _position(mesh, device), strict=True))


def _axis_types(mesh: Any) -> tuple[Any, ...] | None:
    types = getattr(mesh, "axis_types", None)
    return tuple(types) if types is not None else None


def submesh(mesh: jax.sharding.Mesh, axes: AxisNames, *, device: Any = None) -> jax.sharding.Mesh:
    """The sub-mesh over `axes` (in the order given) that contains `device`.

    Like PyTorch's `mesh["dp", "tp"]`, but any order of names is accepted.

    Args:
        mesh: the Mesh.
        axes: an axis name or a tuple of names.
        device: a device of the mesh (default: this process's first local device in it).

    Returns:
        A Mesh over those axes.

    Raises:
        MeshConfigError: bad `axes`, a `device` not in the mesh, or no local device in it.
    """
    import jax

    positions = axis_positions(mesh, axes)
    if device is None:
        device = _first_local_device(mesh)
    where = _position(mesh, device)
    index = tuple(slice(None) if i in positions else where[i] for i in range(len(where)))
    kept = sorted(positions)
    grid = np.asarray(mesh.devices)[index]  # the kept axes, in mesh order
    grid = grid.transpose([kept.index(p) for p in positions])
    names = tuple(mesh.axis_names[p] for p in positions)
    types = _axis_types(mesh)
    if types is None:
        return jax.sharding.Mesh(grid, names)
    return jax.sharding.Mesh(grid, names, axis_types=tuple(types[p] for p in positions))


def _first_local_device(mesh: Any) -> Any:
    import jax

    ids = {d.id for d in np.asarray(mesh.devices).flat}
    for local in jax.local_devices():
        if local.id in ids:
            return local
    raise MeshConfigError(
        f"device=None: no local device of process {jax.process_index()} is in the mesh; "
        "accepted: pass device= explicitly"
    )


def flatten_axes(mesh: jax.sharding.Mesh, axes: Sequence[str], name: str) -> jax.sharding.Mesh:
    """`axes` (adjacent or not) merged into one axis `name`, where the first of them stood.

    Along the new axis the devices run row-major over `axes` in the order given, so
    `flatten_axes(mesh, ("dp", "tp"), "x")` numbers devices like PyTorch's flattened ranks.

    Args:
        mesh: the Mesh.
        axes: a tuple of axis names to merge.
        name: the merged axis's name (new, or one of the merged axes' names).

    Returns:
        A Mesh with the merged axis.

    Raises:
        MeshConfigError: a single name for `axes`, bad names, a `name` an axis that stays
            already has, or merged axes of different axis types.
    """
    import jax

    if isinstance(axes, str):
        raise MeshConfigError(
            f"axes={axes!r} is a single name; accepted: a tuple of axis names to merge"
        )
    positions = axis_positions(mesh, axes)
    names = tuple(mesh.axis_names)
    if not isinstance(name, str) or not name:
        raise MeshConfigError(f"name={name!r}; accepted: a non-empty string")
    rest = [n for i, n in enumerate(names) if i not in positions]
    if name in rest:
        raise MeshConfigError(
            f"name={name!r} is already the name of an axis that stays ({rest}); accepted: a "
            "new name or one of the merged axes' names"
        )
    order: list[int] = []
    new_names: list[str] = []
    for i, axis in enumerate(names):
        if i == positions[0]:
            order.extend(positions)
            new_names.append(name)
        elif i not in positions:
            order.append(i)
            new_names.append(axis)
    devices = np.asarray(mesh.devices)
    new_shape = []
    for axis in new_names:
        new_shape.append(
            math.prod(devices.shape[p] for p in positions)
            if axis == name
            else devices.shape[names.index(axis)]
        )
    grid = devices.transpose(order).reshape(new_shape)
    types = _axis_types(mesh)
    if types is None:
        return jax.sharding.Mesh(grid, tuple(new_names))
    merged = {types[p] for p in positions}
    if len(merged) > 1:
        raise MeshConfigError(
            f"axes={tuple(axes)!r} have different axis types {[str(types[p]) for p in positions]}"
            "; accepted: axes of one type"
        )
    new_types = tuple(
        types[positions[0]] if n == name else types[names.index(n)] for n in new_names
    )
    return jax.sharding.Mesh(grid, tuple(new_names), axis_types=new_types)
