"""How good a layout is, per mesh axis (DESIGN.md section 5). Pure numpy.

Every line of devices along an axis is cut into its ICI runs (consecutive devices of one
granule). A run of k > 2 devices is a ring of k steps (last back to first), a run of 2 is one
step. On a TPU torus a step costs the hop distance between its chips (sum over dims of
`min(d, n - d)` where the dim wraps, else `d`); cores of one chip are 0 apart. On a switched
fabric (GPU NVLink, CPU) every step is one hop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .solver.hybrid import Layout


@dataclass(frozen=True)
class AxisQuality:
    """The ring quality of one mesh axis."""

    axis: str
    size: int
    ici: int
    dcn: int
    ring_steps: int  # over all ICI runs of all lines
    hops: int  # physical hops those steps take
    efficiency: float  # ring_steps / hops; 1.0 = every step a direct link
    dcn_crossings: int  # per line, the most granule changes seen
    dcn_ok: bool  # every line enters each granule once: crossings == dcn - 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def axis_quality(layout: Layout, coords: np.ndarray | None, axis_names: tuple[str, ...],
                 dcn_mesh_shape: tuple[int, ...]) -> dict[str, AxisQuality]:
    """The quality of every axis of `layout`; `coords` are chip positions per table row."""
    result = {}
    for axis, name in enumerate(axis_names):
        size = layout.index.shape[axis]
        dcn = dcn_mesh_shape[axis]
        ici = size // dcn
        lines = np.moveaxis(layout.index, axis, -1).reshape(-1, size)
        granules = layout.granule[lines]
        crossings = (granules[:, 1:] != granules[:, :-1]).sum(axis=1)
        runs = lines.reshape(-1, ici)  # one row per ICI run
        steps, hops = _ring_cost(runs, layout, coords)
        result[name] = AxisQuality(
            axis=name, size=size, ici=ici, dcn=dcn, ring_steps=steps, hops=hops,
            efficiency=round(steps / hops, 6) if hops else 1.0,
            dcn_crossings=int(crossings.max()), dcn_ok=bool((crossings == dcn - 1).all()),
        )
    return result


def _ring_cost(runs: np.ndarray, layout: Layout, coords: np.ndarray | None) -> tuple[int, int]:
    """(steps, hops) over all runs: each run closes into a ring when longer than 2."""
    k = runs.shape[1]
    if k < 2:
        return 0, 0
    nxt = np.roll(runs, -1, axis=1) if k > 2 else runs[:, 1:]
    cur = runs if k > 2 else runs[:, :1]
    steps = cur.size
    torus = layout.torus
    if torus is None or coords is None:
        return steps, steps
    delta = np.abs(coords[cur] - coords[nxt])  # (runs, steps, dims)
    dims = np.asarray(torus.chip_shape)
    wrapped = np.minimum(delta, dims - delta)
    delta = np.where(np.asarray(torus.wrap), wrapped, delta)
    return steps, int(delta.sum())
