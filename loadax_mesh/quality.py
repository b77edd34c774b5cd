"""How good a layout is, per mesh axis (docs/design.md section 5). Pure numpy.

Every line of devices along an axis (all other mesh coordinates fixed) is cut into its ICI runs:
maximal stretches of consecutive devices in one granule. A run of k > 2 devices is a ring of k
steps (last back to first), a run of 2 is one step, a run of 1 none. On a TPU torus a step
costs the hop distance between its chips (sum over dims of `min(d, n - d)` where the dim wraps,
else `d`); cores of one chip are 0 apart. On a switched fabric (GPU NVLink, CPU) every step is
one hop. The DCN side of a line is good when it enters each of its granules exactly once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .solver.hybrid import Layout, Torus


@dataclass(frozen=True)
class AxisQuality:
    """The ring quality of one mesh axis."""

    axis: str
    size: int
    ici: int
    dcn: int
    ring_steps: int  # over all ICI runs of all lines
    hops: int  # physical hops those steps take
    efficiency: float  # ring_steps / hops; 1.0 = every step a direct link (1.0 if no hops)
    dcn_crossings: int  # per line, the most granule changes seen
    dcn_ok: bool  # every line enters each of `dcn` granules once: dcn - 1 changes, dcn granules
    ici_dims: int = 1  # torus dims its ICI runs span (1 off a torus, 0 with no ICI ring)

    @property
    def link_factor(self) -> float:
        """What a collective over this axis gets of one link pair's bandwidth: its ring
        efficiency times the torus dims it spans, each a ring of its own links (a gather over
        two dims of ICI runs on both at once: the scaling book, "Sharded Matrices", AllGather
        over multiple axes; docs/facts/hardware.md)."""
        return self.efficiency * max(self.ici_dims, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def axis_quality(
    layout: Layout,
    coords: np.ndarray | None,
    axis_names: tuple[str, ...],
    dcn_mesh_shape: tuple[int, ...],
) -> dict[str, AxisQuality]:
    """The quality of every axis of `layout`; `coords` are chip positions per table row."""
    torus = layout.torus if coords is not None else None
    result = {}
    for axis, name in enumerate(axis_names):
        size = layout.index.shape[axis]
        dcn = dcn_mesh_shape[axis]
        lines = np.moveaxis(layout.index, axis, -1).reshape(-1, size)
        granules = layout.granule[lines]
        changes = granules[:, 1:] != granules[:, :-1]
        crossings = changes.sum(axis=1)
        distinct = 1 + (np.diff(np.sort(granules, axis=1), axis=1) != 0).sum(axis=1)
        steps, hops = ring_cost(lines, ~changes, torus, coords)
        result[name] = AxisQuality(
            axis=name,
            size=size,
            ici=size // dcn,
            dcn=dcn,
            ring_steps=steps,
            hops=hops,
            efficiency=round(steps / hops, 6) if hops else 1.0,
            dcn_crossings=int(crossings.max()),
            dcn_ok=bool(((crossings == dcn - 1) & (distinct == dcn)).all()),
            ici_dims=spanned_dims(lines, ~changes, torus, coords),
        )
    return result


def ring_cost(
    lines: np.ndarray, same: np.ndarray, torus: Torus | None, coords: np.ndarray | None
) -> tuple[int, int]:
    """(steps, hops) over every run of every line; `same[i, j]` says whether devices j and j+1
    of line i are in one granule (one run). Runs longer than 2 close into rings."""
    rows, size = lines.shape
    if size < 2:
        return 0, 0
    # Flat positions of each run's first and last device.
    first = np.ones((rows, size), bool)
    first[:, 1:] = ~same
    last = np.ones((rows, size), bool)
    last[:, :-1] = ~same
    starts, ends = np.flatnonzero(first), np.flatnonzero(last)
    closing = ends - starts + 1 > 2
    flat = lines.reshape(-1)
    cur = np.concatenate([lines[:, :-1][same], flat[ends[closing]]])
    nxt = np.concatenate([lines[:, 1:][same], flat[starts[closing]]])
    steps = len(cur)
    if torus is None or coords is None:
        return steps, steps
    delta = np.abs(coords[cur] - coords[nxt])
    dims = np.asarray(torus.chip_shape)
    delta = np.where(np.asarray(torus.wrap), np.minimum(delta, dims - delta), delta)
    return steps, int(delta.sum())


def spanned_dims(
    lines: np.ndarray, same: np.ndarray, torus: Torus | None, coords: np.ndarray | None
) -> int:
    """How many torus dims the ICI runs of `lines` span at most (chips' coordinates that change
    between neighbours of one granule); 1 off a torus, 0 where no run has two devices."""
    if not same.any():
        return 0
    if torus is None or coords is None:
        return 1
    step = coords[lines[:, 1:]] != coords[lines[:, :-1]]  # rows x size-1 x dims
    varying = (step & same[:, :, None]).any(axis=1)
    return max(1, int(varying.sum(axis=1).max()))


def order_quality(
    layout: Layout,
    ids: np.ndarray,
    coords: np.ndarray | None,
    devices: np.ndarray,
    axis_names: tuple[str, ...],
    dcn_mesh_shape: tuple[int, ...],
) -> dict[str, AxisQuality]:
    """The quality of another order of the same devices (for example jax's `mesh_utils`),
    judged on `layout`'s granules and torus: `devices` is mesh-shaped and holds the devices
    whose ids are `ids` (one per table row)."""
    row = {int(i): r for r, i in enumerate(ids)}
    index = np.array([row[int(d.id)] for d in devices.flat], dtype=np.int64)
    other = Layout(
        index=index.reshape(devices.shape),
        granule=layout.granule,
        num_granules=layout.num_granules,
        torus=layout.torus,
    )
    return axis_quality(other, coords, axis_names, dcn_mesh_shape)
