"""Pipeline stages for people: what a ranking's pipeline costs and saves against the fastest
mesh without one (under `plan --strategy auto`'s ranking); which granules, hosts and devices
form each stage of a plan is picture.py's `stage_lines`.

A pipeline's terms, as cost/pipeline/stages.py prices them: the bubble (S - 1) / (M R + S - 1) of
its schedule, computed on zeros (the compute it adds), the stage-to-stage activations
(collective-permutes on the critical path, over DCN where the stages span granules), the rest
of the pipeline axis's traffic, and what it saves: the batch axes' weight gathers and gradient
reductions across granules of a mesh without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..cost.timing.axes import axis_total
from .picture import shape_text
from .report import size_text

if TYPE_CHECKING:
    from ..cost.estimate import Estimate
    from ..cost.parts.traffic import Collective
    from .ranked import ChoiceView, RankingView

PERMUTES = "collective-permute"


def pipeline_lines(ranking: RankingView) -> list[str]:
    """The ranking's pipeline notes: the degrees searched by default, the fastest mesh with a
    pipeline and the fastest without, each's terms, and why the pipeline wins or loses."""
    out = []
    staged, plain = ranking.with_pipeline, ranking.without_pipeline
    if ranking.stages:
        degrees = ", ".join(map(str, ranking.stages))
        none = "" if staged is not None else "; none fits or is priced (pruned above)"
        out.append(
            f"pipelines  searched across granules: {degrees} stages, each over whole granules "
            f"(the pipeline's DCN factor){none}"
        )
    if staged is None or plain is None:
        return out
    s, p = staged.estimate, plain.estimate
    pipe = s.pipeline
    assert pipe is not None
    a = s.axes[pipe.axis]
    permutes = [c for c in a.collectives if c.kind == PERMUTES and "stage-to-stage" in c.what]
    moved = sum(c.bytes * c.count for c in permutes)
    where = "DCN" if a.dcn > 1 else "ICI"
    took = ""
    if ranking.device is not None:  # the permutes alone, priced as the axis prices them
        link = staged.plan.quality()[pipe.axis].link_factor
        t = axis_total(permutes, pipe.axis, "pipeline", a.ici, a.dcn, link, ranking.device)
        took = f", {t.seconds:.2f} s"
    line = (
        f"{_place(ranking, staged)} {_mesh(s)} pp{pipe.stages} M{pipe.microbatches} "
        f"R{pipe.repeats}: bubble {pipe.bubble:.1%} ({pipe.iterations} iterations of "
        f"{pipe.microbatches} micro-batches x {pipe.repeats} repeat{'s' * (pipe.repeats > 1)}), "
        f"compute "
        f"{s.time.compute:.2f} s; stage-to-stage {size_text(moved)} a step over {where}{took}; "
        f"the pipeline axis {size_text(a.bytes)}, {a.seconds:.2f} s{_largest(a.collectives)}; "
        f"across granules {s.time.across_granules:.2f} s{_dcn_axes(s)}"
    )
    out.append(f"with       {line}")
    if ranking.schedule_saves is not None:
        held, gpipe = ranking.schedule_saves
        out.append(
            f"schedule   1F1B: a stage holds {size_text(held)} where GPipe's schedule would hold "
            f"{size_text(gpipe)} at the same recipe (1F1B keeps only the micro-batches in flight; "
            "its step is GPipe's with the head of every micro-batch on the last stage's ticks)"
        )
    out.append(
        f"without    {_place(ranking, plain)} {_mesh(p)}: compute {p.time.compute:.2f} s; "
        f"across granules {p.time.across_granules:.2f} s{_dcn_axes(p)}"
    )
    out.append(f"           {_why(s, p)}")
    return out


def _largest(found: Iterable[Collective], most: int = 2) -> str:
    """The pipeline axis's largest transfers besides the stage-to-stage permutes, by bytes a
    step (what else its total holds)."""
    rest = sorted(
        (c for c in found if "stage-to-stage" not in c.what),
        key=lambda c: -c.bytes * c.count,
    )[:most]
    named = ", ".join(f"{c.what} {size_text(c.bytes * c.count)}" for c in rest)
    return f" (of which {named})" if rest else ""


def _why(s: Estimate, p: Estimate) -> str:
    """Why the pipeline wins or loses: the step's difference in compute (the bubble) and in
    time across granules (the stages' traffic against the batch axes' over DCN)."""
    compute = s.time.compute - p.time.compute
    dcn = s.time.across_granules - p.time.across_granules
    rest = (s.step_seconds - p.step_seconds) - compute - dcn
    verdict = "wins" if s.step_seconds < p.step_seconds else "loses"
    gap = abs(s.step_seconds - p.step_seconds)
    if compute < 0 or (verdict == "wins" and dcn >= 0):  # no bubble's trade: the terms alone
        because = f"compute {compute:+.2f} s, across granules {dcn:+.2f} s"
    elif verdict == "wins":
        because = (
            f"it waits {-dcn:.2f} s less across granules (its stages' traffic against the "
            f"batch axes' over DCN), more than its bubble and recipe add to compute "
            f"({compute:+.2f} s)"
        )
    elif dcn <= 0:
        because = (
            f"its bubble and recipe add {compute:+.2f} s of compute, more than the "
            f"{-dcn:.2f} s it saves across granules"
        )
    else:
        because = (
            f"its bubble and recipe add {compute:+.2f} s of compute and its stages wait "
            f"{dcn:.2f} s more across granules (their traffic against the batch axes' over DCN)"
        )
    other = f"; other terms {rest:+.2f} s" if abs(rest) >= 0.005 else ""
    return f"the pipeline {verdict} by {gap:.2f} s: {because}{other}"


def _dcn_axes(e: Estimate) -> str:
    """The axes that cross granules and their seconds there, e.g. " (fsdp 31.45 s, data 7.10 s)"."""
    parts = [f"{a.axis} {a.dcn_seconds:.2f} s" for a in e.axes.values() if a.dcn_seconds > 0]
    return f" ({', '.join(parts)})" if parts else ""


def _place(ranking: RankingView, choice: ChoiceView) -> str:
    """Where a choice ranks, e.g. "3." (or "(not in the top)")."""
    for k, c in enumerate(ranking, 1):
        if c is choice:
            return f"{k}."
    return f"(not in the top {len(ranking)})"


def _mesh(e: Estimate) -> str:
    return shape_text(e.mesh, drop_ones=True) or "1 device"
