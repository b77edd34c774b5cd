"""The plan as AXLearn trainer-config text: `mesh_axis_names`, `mesh_shape` (a
`HybridMeshShape` where the DCN part is not trivial) and a `mesh_rules` entry for the hardware
string.

Facts from AXLearn (axlearn/common/utils.py, trainer configs): its standard axes are
`(pipeline, data, expert, fsdp, seq, model)`, "from least to most communication intensive";
mesh rules are `(regex, shape)` pairs matched with `re.fullmatch`; it builds each granule's mesh
with `mesh_utils.create_device_mesh` (a plain reshape where that refuses) and places granules
on the DCN grid, granules being slices on TPU and processes elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError
from ..hardware.traits import platform_traits
from .axes import named_roles, quantization_notes, trainer_axes
from .order import OrderComparison, compare_order

if TYPE_CHECKING:
    from ..view.picture import PlanView

AXES = ("pipeline", "data", "expert", "fsdp", "seq", "model")
_ROLE_AXIS = {
    "fsdp": "fsdp",
    "model": "model",
    "seq": "seq",
    "expert": "expert",
    "pipeline": "pipeline",
}


@dataclass(frozen=True)
class AXLearnConfig:
    """AXLearn's mesh fields for a plan, as values and as Python text."""

    mesh_axis_names: tuple[str, ...]
    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]
    batch_axis_names: tuple[str, ...]
    selector: str
    notes: tuple[str, ...]
    order: OrderComparison | None = field(default=None, compare=False)

    @property
    def regex(self) -> str:
        """The hardware string as a mesh-rule regex (AXLearn matches with `re.fullmatch`)."""
        return self.selector.replace(".", r"\.")

    @property
    def hybrid(self) -> bool:
        return any(d > 1 for d in self.dcn_mesh_shape)

    def shape_text(self) -> str:
        """The mesh_shape as AXLearn code writes it."""
        if not self.hybrid:
            return repr(self.ici_mesh_shape)
        return (
            f"HybridMeshShape(ici_mesh_shape={self.ici_mesh_shape!r}, "
            f"dcn_mesh_shape={self.dcn_mesh_shape!r})"
        )

    def text(self) -> str:
        """Python text for an AXLearn trainer config, with comments saying what is lost."""
        lines = [f"# {n}" for n in self.notes]
        if self.order is not None:
            lines += [f"# {line}" for line in self.order.lines("AXLearn")]
        if self.hybrid:
            lines.append("from axlearn.common.utils import HybridMeshShape")
        lines += [
            f"mesh_axis_names = {self.mesh_axis_names!r}",
            f"batch_axis_names = {self.batch_axis_names!r}",
            f"mesh_shape = {self.shape_text()}",
            "mesh_rules = (",
            f'    (r"{self.regex}", {self.shape_text()}),',
            ")",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mesh_axis_names": list(self.mesh_axis_names),
            "ici_mesh_shape": list(self.ici_mesh_shape),
            "dcn_mesh_shape": list(self.dcn_mesh_shape),
            "batch_axis_names": list(self.batch_axis_names),
            "mesh_rules": [[self.regex, self.shape_text()]],
            "text": self.text(),
            "notes": list(self.notes),
            "order": None if self.order is None else self.order.to_dict(),
        }


def axis_map(plan: PlanView, who: str) -> dict[str, str]:
    """Plan axis (size > 1) -> AXLearn's standard axis name; refused where it has none."""
    r = named_roles(plan, who, f"has no {', '.join(AXES)} name")
    return trainer_axes(plan, r, _ROLE_AXIS, who)


def to_axlearn(plan: PlanView, *, order: bool = True, quantization: str = "none") -> AXLearnConfig:
    """AXLearn's mesh fields for `plan`; `order` compares AXLearn's device order (jax's
    mesh_utils per granule, which imports jax) with the plan's; `quantization` the recipe's
    (TrainSpec.quantization), which no mesh field carries: a note says so."""
    axes = axis_map(plan, "to_axlearn")
    ici, dcn = [1] * len(AXES), [1] * len(AXES)
    for k, name in enumerate(plan.axis_names):
        if name in axes:
            ici[AXES.index(axes[name])] = plan.ici_mesh_shape[k]
            dcn[AXES.index(axes[name])] = plan.dcn_mesh_shape[k]
    mapped = {axes[b] for b in plan.batch_axis_names if b in axes}
    batch = tuple(a for a in AXES if a in mapped) or ("data",)
    if any(axes.get(b) in ("model", "pipeline") for b in plan.batch_axis_names):
        raise MeshConfigError(
            f"to_axlearn: batch axes {list(plan.batch_axis_names)} include a model or pipeline "
            "axis; accepted: batch axes that are data, fsdp or seq axes"
        )
    notes = [
        f"AXLearn mesh for {plan.hardware}: "
        + (", ".join(f"{a} -> {t}" for a, t in axes.items()) or "all axes size 1"),
        "lost: the device order; AXLearn builds each granule's mesh with jax's mesh_utils "
        "(ring quality below)",
    ]
    if "pipeline" in axes.values():
        notes.append(
            "not exported: the pipeline schedule (microbatches, repeats, which layers), which "
            "AXLearn sets on its model's Pipeline layer (axlearn/common/pipeline.py), not the mesh"
        )
    notes += quantization_notes(quantization, "AXLearn's mesh fields", "its model config")
    comparison = None
    if order:
        comparison = compare_order(
            plan,
            {a: AXES.index(t) for a, t in axes.items()},
            len(AXES),
            process_is_granule=not platform_traits(plan.table.platform).multislice,
            fallback="reshape",
        )
    return AXLearnConfig(
        mesh_axis_names=AXES,
        ici_mesh_shape=tuple(ici),
        dcn_mesh_shape=tuple(dcn),
        batch_axis_names=batch,
        selector=plan.hardware,
        notes=tuple(notes),
        order=comparison,
    )
