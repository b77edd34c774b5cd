"""What a trainer that builds its mesh with jax's `mesh_utils` does to the plan's device order.

MaxText and AXLearn take mesh degrees, not a device order: they call
`mesh_utils.create_device_mesh` (one granule) or `create_hybrid_device_mesh` (several) on the
same devices. This module calls the real `mesh_utils` (jax is imported here, lazily, only when
a comparison is asked for) and judges its order with the plan's own quality measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..quality import AxisQuality, order_quality

if TYPE_CHECKING:
    from ..view.picture import PlanView


@dataclass(frozen=True)
class OrderComparison:
    """Per mesh axis, the ICI ring efficiency of the plan's order and of `mesh_utils`' order
    for the same degrees; `split` whether mesh_utils needed `allow_split_physical_axes`;
    `refused` its error where it builds no mesh even then."""

    ours: dict[str, AxisQuality]
    theirs: dict[str, AxisQuality] | None
    split: bool
    refused: str | None = None

    def lines(self, trainer: str) -> list[str]:
        """One line per axis of size > 1: ours against theirs."""
        if self.theirs is None:
            return [f"{trainer}'s mesh_utils builds no mesh for these degrees: {self.refused}"]
        out = []
        for name, q in self.ours.items():
            if q.size == 1:
                continue
            t = self.theirs[name]
            dcn = "" if q.dcn == 1 else f", DCN crossings ok: ours {q.dcn_ok}, theirs {t.dcn_ok}"
            out.append(
                f"axis {name} ({q.size}): ring efficiency ours {q.efficiency:.2f}, "
                f"{trainer}'s mesh_utils {t.efficiency:.2f}{dcn}"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ours": {n: q.efficiency for n, q in self.ours.items()},
            "theirs": None
            if self.theirs is None
            else {n: q.efficiency for n, q in self.theirs.items()},
            "allow_split_physical_axes": self.split,
            "refused": self.refused,
        }


def compare_order(
    plan: PlanView,
    placement: dict[str, int],
    num_axes: int,
    *,
    process_is_granule: bool = False,
    fallback: str = "split",
) -> OrderComparison:
    """Build the trainer's device order with `mesh_utils` and judge it per axis of `plan`.

    `placement` gives, for each plan axis of size > 1, its index among the trainer's
    `num_axes` mesh axes; the trainer's other axes have size 1. One granule:
    `create_device_mesh(ici)`; several: `create_hybrid_device_mesh(ici, dcn)`. Where mesh_utils
    refuses, `fallback` "split" asks again with `allow_split_physical_axes=True` (MaxText's
    option); "reshape" builds each granule's mesh and falls back to a plain reshape of its
    devices where mesh_utils refuses (AXLearn's `build_standard_mesh`)."""
    ici, dcn = [1] * num_axes, [1] * num_axes
    for k, name in enumerate(plan.axis_names):
        if name in placement:
            ici[placement[name]] = plan.ici_mesh_shape[k]
            dcn[placement[name]] = plan.dcn_mesh_shape[k]
    devices = list(plan.table.devices)
    ours = plan.quality()
    if fallback == "reshape":
        attr = "process_index" if process_is_granule else "slice_index"
        grid, split = _per_granule(ici, dcn, devices, attr), False
    else:
        found, split, refused = _hybrid(ici, dcn, devices, plan.num_granules, process_is_granule)
        if found is None:
            return OrderComparison(ours, None, split=True, refused=refused)
        grid = found
    # The trainer's axes of size > 1 in the plan's axis order, then the plan's shape.
    mapped = [name for name in plan.axis_names if name in placement]
    order = [placement[name] for name in mapped]
    rest = [k for k in range(num_axes) if k not in order]
    grid = np.transpose(np.asarray(grid), [*order, *rest]).reshape(plan.devices.shape)
    theirs = order_quality(
        plan.layout, plan.table.ids, plan.table.coords, grid, plan.axis_names, plan.dcn_mesh_shape
    )
    return OrderComparison(ours, theirs, split=split)


def _hybrid(
    ici: list[int], dcn: list[int], devices: list[Any], granules: int, process_is_granule: bool
) -> tuple[Any, bool, str | None]:
    """jax's own mesh (hybrid over several granules), asked again with split physical axes
    where it refuses: (the device grid or None, whether it split, its last refusal)."""
    from jax.experimental import mesh_utils

    refused = None
    for split in (False, True):
        try:
            if granules > 1:
                return (
                    mesh_utils.create_hybrid_device_mesh(
                        ici,
                        dcn,
                        devices,
                        process_is_granule=process_is_granule,
                        allow_split_physical_axes=split,
                    ),
                    split,
                    None,
                )
            return (
                mesh_utils.create_device_mesh(
                    ici, devices, contiguous_submeshes=False, allow_split_physical_axes=split
                ),
                split,
                None,
            )
        except (NotImplementedError, ValueError, AssertionError, AttributeError) as err:
            refused = " ".join(str(err).split())
    return None, True, refused


def _per_granule(ici: list[int], dcn: list[int], devices: list[Any], attr: str) -> Any:
    """AXLearn's assembly: granules by `attr` (slice_index or process_index), sorted;
    each granule's mesh from `mesh_utils.create_device_mesh`, else its devices reshaped; the
    granule meshes placed on the DCN grid with `np.block`."""
    from jax.experimental import mesh_utils

    def build(group: list[Any]) -> np.ndarray:
        try:
            return np.asarray(mesh_utils.create_device_mesh(ici, devices=group))
        except NotImplementedError:
            return np.asarray(group, dtype=object).reshape(ici)

    groups: dict[Any, list[Any]] = {}
    for d in devices:
        groups.setdefault(getattr(d, attr, None) or 0, []).append(d)
    meshes = [build(groups[k]) for k in sorted(groups)]
    if len(meshes) == 1:
        return meshes[0]
    grid = np.arange(len(meshes)).reshape(dcn)
    blocks = np.vectorize(lambda i: meshes[i], otypes=[object])(grid)
    return np.block(blocks.tolist())
