"""What the exports share: the roles of a plan's axes, refusing an axis no trainer can name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MeshConfigError
from ..workload.layout import PIPELINE_NAMES, ROLE_NAMES, Roles, roles

if TYPE_CHECKING:
    from ..view.picture import PlanView


def named_roles(
    plan: PlanView, who: str, problem: str, *, batch: str = "", named: str = ""
) -> Roles:
    """The plan's axis roles. An axis larger than 1 that is neither a batch axis nor named for
    a role (ROLE_NAMES, or the pipeline's PIPELINE_NAMES: the exports take pipelines) is a
    MeshConfigError: `who` and `problem` say what refuses it, `batch`
    and `named` what the accepted axes become there."""
    known = {n for names in (*ROLE_NAMES.values(), PIPELINE_NAMES) for n in names}
    for name, size in plan.shape.items():
        if size > 1 and name not in known and name not in plan.batch_axis_names:
            raise MeshConfigError(
                f"{who}: mesh axis {name!r} (size {size}) {problem}; accepted: batch axes{batch} "
                f"or axes named {', '.join(sorted(known))}{named}"
            )
    return roles(tuple(plan.shape.items()), plan.batch_axis_names)


def trainer_axes(plan: PlanView, r: Roles, names: dict[str, str], who: str) -> dict[str, str]:
    """Plan axis (size > 1) -> the trainer's axis: the fsdp, model, seq, expert and pipeline
    roles by `names` (a role it lacks is left out), the remaining batch axis as "data"; two
    batch axes left over are refused (a trainer has one data axis)."""
    out = {
        axis: names[role]
        for role in ("fsdp", "model", "seq", "expert", "pipeline")
        if role in names and (axis := getattr(r, role)) is not None and plan.shape[axis] > 1
    }
    data = [a for a in r.data_parallel_axes() if a not in out]
    if len(data) > 1:
        raise MeshConfigError(
            f"{who}: batch axes {data} would all be the one data axis; accepted: one batch axis "
            "besides the fsdp axis"
        )
    return {**out, **{a: "data" for a in data}}


def quantization_notes(quantization: str, what: str, where: str) -> list[str]:
    """The note an export adds where it has no key for the recipe's precision
    (TrainSpec.quantization): `what` has none, `where` is where the trainer sets it."""
    if quantization == "none":
        return []
    return [
        f"not exported: quantization={quantization!r} (the projections' and MLP matmuls in "
        f"{quantization}): {what} carry no precision; set it in {where}"
    ]
