"""The plan as text (interim: the summary lines; the CLI issue adds the grid and SVG)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import MeshPlan


def render_text(plan: MeshPlan) -> str:
    lines = [f"hardware: {plan.hardware or 'unknown'}  granules: {plan.num_granules} "
             f"({plan.granule_kind})"]
    for name, q in plan.quality().items():
        lines.append(f"  {name:>12} size {q.size:>5} = ici {q.ici} x dcn {q.dcn}  "
                     f"ring efficiency {q.efficiency:.3f}  dcn crossings {q.dcn_crossings}")
    lines.append(f"batch axes: {', '.join(plan.batch_axis_names)} "
                 f"(data-parallel degree {plan.data_parallel_size})")
    return "\n".join(lines)
