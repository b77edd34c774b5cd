"""Mesh shapes: validation, `-1` inference and the default ICI/DCN split. Pure Python."""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import MeshConfigError

MeshShape = tuple[int, ...]
"""A tuple of positive ints; one entry may be `-1`, meaning "the rest"."""

_log = logging.getLogger("loadax_mesh")


def _as_int(value: Any) -> int | None:
    """`value` as an int if it is one (numpy ints too); bools, floats and strings give None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _type_note(value: Any) -> str:
    """' (float)' for a value that is no int at all, so `16.5` and `'16'` read clearly."""
    if isinstance(value, bool) or _as_int(value) is not None:
        return ""
    return f" ({type(value).__name__})"


def check_size(value: Any, *, field: str) -> int:
    """`value` if it is a positive int, else a MeshConfigError naming `field`."""
    size = _as_int(value)
    if size is None or size < 1:
        raise MeshConfigError(
            f"{field}={value!r}{_type_note(value)}; accepted: a positive int (the axis size)"
        )
    return size


def check_shape(value: Any, *, field: str, allow_rest: bool = True) -> MeshShape:
    """`value` as a tuple of ints, or a MeshConfigError naming `field`.

    Accepts a tuple or list of ints (numpy ints too); each entry >= 1, with at most one `-1`
    when `allow_rest`. Floats, strings and bools are errors, never coerced.
    """
    accepted = "a tuple of positive ints" + (" with at most one -1" if allow_rest else "")
    if not isinstance(value, tuple | list) or not value:
        raise MeshConfigError(f"{field}={value!r} is not {accepted}")
    dims = []
    for entry in value:
        dim = _as_int(entry)
        if dim is None or (dim < 1 and not (dim == -1 and allow_rest)):
            raise MeshConfigError(
                f"{field}={value!r} holds {entry!r}{_type_note(entry)}; accepted: {accepted}"
            )
        dims.append(dim)
    if dims.count(-1) > 1:
        raise MeshConfigError(f"{field}={value!r} has more than one -1; accepted: {accepted}")
    return tuple(dims)


@dataclass(frozen=True)
class HybridMeshShape:
    """A mesh shape split into its ICI part (inside a granule) and DCN part (across granules).

    Along axis `i` the mesh has `ici_mesh_shape[i] * dcn_mesh_shape[i]` devices; each part may
    hold one -1 (ICI: the devices per granule; DCN: the granules).

    Raises:
        MeshConfigError: when built with parts of different lengths or invalid sizes.
    """

    ici_mesh_shape: MeshShape
    dcn_mesh_shape: MeshShape

    def __post_init__(self) -> None:
        ici = check_shape(self.ici_mesh_shape, field="ici_mesh_shape")
        dcn = check_shape(self.dcn_mesh_shape, field="dcn_mesh_shape")
        if len(ici) != len(dcn):
            raise MeshConfigError(
                f"ici_mesh_shape={ici} has {len(ici)} axes but dcn_mesh_shape={dcn} has "
                f"{len(dcn)}; accepted: two shapes of the same length"
            )
        object.__setattr__(self, "ici_mesh_shape", ici)
        object.__setattr__(self, "dcn_mesh_shape", dcn)

    def __len__(self) -> int:
        return len(self.ici_mesh_shape)


def infer_mesh_shape(
    mesh_shape: Sequence[int], *, num_devices: int, field: str = "mesh_shape"
) -> MeshShape:
    """`mesh_shape` with its `-1` replaced so that the product equals `num_devices`.

    Without a `-1` the product must equal `num_devices` exactly: a mesh that uses fewer devices
    than given is an error, never a silent truncation.

    Args:
        mesh_shape: positive ints, at most one of them -1.
        num_devices: the device count the shape must use.
        field: the name the error message gives the shape.

    Returns:
        The shape as a tuple of positive ints.

    Raises:
        MeshConfigError: an invalid shape, or one whose product cannot equal `num_devices`.
    """
    shape = check_shape(mesh_shape, field=field)
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise MeshConfigError(f"num_devices={num_devices!r} is not a positive int")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if num_devices % known:
            raise MeshConfigError(
                f"{field}={shape}: the other axes take {known} devices, which does not divide "
                f"{num_devices}; accepted: a shape whose fixed axes divide {num_devices}"
            )
        return tuple(num_devices // known if d == -1 else d for d in shape)
    if known != num_devices:
        raise MeshConfigError(
            f"{field}={shape} uses {known} devices but {num_devices} are given; accepted: a "
            f"shape whose product is {num_devices} (or one -1 for the rest)"
        )
    return shape


def resolve_hybrid(
    shape: HybridMeshShape, *, num_granules: int, granule_size: int
) -> HybridMeshShape:
    """Resolve both `-1`s: DCN against the granule count, ICI against devices per granule."""
    dcn = infer_mesh_shape(shape.dcn_mesh_shape, num_devices=num_granules, field="dcn_mesh_shape")
    ici = infer_mesh_shape(shape.ici_mesh_shape, num_devices=granule_size, field="ici_mesh_shape")
    return HybridMeshShape(ici, dcn)


def split_mesh_shape(
    mesh_shape: Sequence[int], *, num_devices: int, num_granules: int
) -> HybridMeshShape:
    """The default ICI/DCN split of a plain shape over `num_granules` equal granules.

    Axis `i` takes `gcd(size_i, granules left)` granules, left to right; this always succeeds,
    as the granule count divides the device count. Where the first axis larger than 1 divides
    by the granule count (AXLearn's rule) that axis takes them all; other splits are logged as
    a warning, since a DCN factor on a later axis is usually slow.
    """
    shape = infer_mesh_shape(mesh_shape, num_devices=num_devices)
    left = num_granules
    dcn = []
    for size in shape:
        take = math.gcd(size, left)
        dcn.append(take)
        left //= take
    # Per prime, gcd takes min(exponent on the axis, exponent still needed), so the granules
    # always run out exactly: the granule count divides the device count.
    assert left == 1, (shape, num_granules)
    hybrid = HybridMeshShape(tuple(s // d for s, d in zip(shape, dcn, strict=True)), tuple(dcn))
    first = next((s for s in shape if s > 1), 1)
    if num_granules > 1 and first % num_granules:
        _log.warning(
            "loadax_mesh: mesh_shape=%s over %d granules: the first axis larger than 1 does not "
            "divide by the granule count, so the DCN part is spread as %s",
            shape,
            num_granules,
            hybrid,
        )
    return hybrid
