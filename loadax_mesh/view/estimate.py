"""The cost model's answers as text and data: one estimate's breakdown (`loadax-mesh estimate`)
and the ranking `choose_mesh` gives (`plan --strategy auto`, printed before the winner's plan)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..cost.band import DOES_NOT_FIT, FITS, UNSURE, memory_band
from ..hardware.given import GIVEN
from .compile import gpu_pool_text
from .picture import shape_text
from .report import size_text, text_table
from .stages import pipeline_lines

if TYPE_CHECKING:
    from ..cost.estimate import Estimate
    from .ranked import RankingView


def auto_note(ranking: RankingView, searched: list[str], *, seq_len: int | None = None) -> str:
    """The note under a plan that `--strategy auto` chose: how many meshes, which recipe flags
    were searched (not given), the model and `seq_len` (the sequence length priced, where
    given), and the winner's recipe as the command line writes it."""
    what = f" and recipes ({', '.join(searched)} searched)" if searched else ""
    train, moe = ranking[0].train, ranking[0].estimate.moe
    p = ranking[0].estimate.pipeline
    stages = (
        ""
        if p is None
        else f", pipeline {p.stages} stages, pipeline microbatches {p.microbatches}, pipeline "
        f"repeats {p.repeats} (bubble {p.bubble:.1%})"
    )
    e = ranking[0].estimate
    return (
        f"strategy auto: the fastest of {ranking.considered} meshes{what} for "
        f"{_workload(e.model, seq_len, e.global_batch)}; recipe remat "
        f"{train.remat_text}, microbatches {train.microbatches}, logits chunks "
        f"{train.logits_chunks}" + (f", moe {moe}" if moe else "") + stages
    )


def _workload(model: str, seq_len: int | None, global_batch: int) -> str:
    """The model and sequences priced, e.g. "llama3-8b, sequence length 8192, global batch 256"
    (the estimate names its model; the caller gives the sequence length, `seq_len`)."""
    length = "" if seq_len is None else f", sequence length {seq_len}"
    return f"{model}{length}, global batch {global_batch}"


def ranking_text(ranking: RankingView) -> str:
    """The ranking as a table: shape, ICI x DCN, memory against HBM, step time, MFU; headed by
    the model and the batch (`auto_note` adds the sequence length, which no estimate holds)."""
    header = ["", "mesh", "ici x dcn", "recipe", "memory", "host", "step", "MFU", "bottleneck"]
    rows: list[list[Any]] = [header]
    for k, c in enumerate(ranking, 1):
        e = c.estimate
        rows.append(
            [
                f"{k}.",
                shape_text(e.mesh, drop_ones=True) or "1 device",
                f"{shape_text(c.ici, compact=True)} x {shape_text(c.dcn, compact=True)}",
                f"{e.remat} x{e.microbatches}"
                + (f" /{e.logits_chunks}" * (e.logits_chunks > 1))
                + (f" {e.moe}" if e.moe else "")
                + _stages(e)
                + _context(e).replace(", context", ""),
                f"{e.memory_bytes / 1e9:.1f} / {e.hbm_bytes / 1e9:.1f} GB"
                + (" (?)" if c.beyond_headroom else " (~)" * (e.verdict == UNSURE)),
                f"{e.host_bytes / 1e9:.1f} GB" if e.host_bytes else "-",
                f"{e.step_seconds:.3f} s" + " (if)" * bool(e.assumes),
                f"{e.mfu:.2f}",
                e.bottleneck,
            ]
        )
    pruned = ", ".join(f"{n} {why}" for why, n in ranking.pruned.items()) or "none"
    unsearched = "".join(f"; not searched: {what}" for what in ranking.unsearched)
    assumed = "".join(f"; {what}" for what in ranking.assumed)
    moe = " MoE-path" if any(c.estimate.moe for c in ranking) else ""
    staged = [c.estimate.pipeline for c in ranking if c.estimate.pipeline]
    pp = " [ppS MM RR: stages, pipeline micro-batches, repeats]" * bool(staged)
    if any(p.lead for p in staged):
        pp = pp[:-1] + "; LN: N last layers pipelined, the first with the pipeline axis as data]"
    marks = []
    if any(c.beyond_headroom for c in ranking):
        marks.append(
            "(?) memory over the headroom's limit but within the model's error of fitting: "
            "ranked last, compile to confirm"
        )
    # within the headroom, but not sure to fit: the estimate's verdict (its JSON's) is UNSURE
    unsure = [
        str(k)
        for k, c in enumerate(ranking, 1)
        if c.estimate.verdict == UNSURE and not c.beyond_headroom
    ]
    if unsure:
        band = memory_band(ranking[0].estimate.profile.platform)
        error = f": {band.text()}," if band is not None else ""
        marks.append(
            f"(~) {', '.join(unsure)}. memory within the model's error{error} so the compiled "
            "step may not fit: compile to confirm"
        )
    if len(ranking) and (why := _why_sequence(ranking[0])):
        marks.append(why)
    if len(ranking) and ranking.numerics:
        step = ranking[0].estimate.step_seconds
        priced = ", ".join(f"{what} {s:.3f} s ({step / s:.2f}x)" for what, s in ranking.numerics)
        marks.append(f"numerics are yours, kept as given; choice 1 with others: {priced}")
    if len(ranking) and ranking[0].estimate.profile.traits.preallocated_pool:
        marks.append(f"memory of a GPU, {gpu_pool_text(ranking[0].estimate.hbm_bytes)}")
    conditions: dict[str, list[str]] = {}  # a condition, without its step -> its rows
    for k, c in enumerate(ranking, 1):
        for a in c.estimate.assumes:
            conditions.setdefault(a.split("; at that bandwidth")[0], []).append(str(k))
    marks += [
        f"(if) {', '.join(rows)}. {text}; each step as priced at that bandwidth"
        for text, rows in conditions.items()
    ]
    given = ranking[0].estimate.given if len(ranking) else {}  # the same for every choice
    first = ranking[0].estimate if len(ranking) else None
    workload = "" if first is None else f"{_workload(first.model, None, first.global_batch)}: "
    return (
        "".join(f"given      {k} = {v} ({GIVEN})\n" for k, v in given.items())
        + f"ranking    {workload}{ranking.considered} shapes x ICI/DCN splits considered; pruned: "
        f"{pruned}; "
        f"{ranking.planned} planned on the real rings{unsearched}{assumed}; recipe: remat x "
        f"micro-batches [/ logits chunks]{moe}{pp}\n{text_table(rows)}"
        + "".join(f"\n           {m}" for m in marks)
        + "".join(f"\n{line}" for line in pipeline_lines(ranking))
    )


def _stages(e: Estimate) -> str:
    """A pipelined estimate's stages, micro-batches and repeats, e.g. " pp4 M8 R2", and its
    pipelined layers where they are not all ("L120")."""
    p = e.pipeline
    if p is None:
        return ""
    return f" pp{p.stages} M{p.microbatches} R{p.repeats}" + (f" L{p.layers}" if p.lead else "")


def _compute_rates(e: Estimate) -> str:
    """What the compute time is priced at (cost/timing/step.py): matmuls and attention kernels at
    the chip's measured shares of its peak where the catalogue has them, else at the calibrated
    share (configs/calibration.toml); memory-bound operations at HBM bandwidth (the measured
    share of it, where the catalogue has one)."""
    d = e.profile.device
    if d is not None and d.matmul_share is not None:
        hbm = " and of HBM bandwidth" if d.memory_share is not None else ""
        return f"at the chip's measured shares of its peak{hbm}"
    return "at the calibrated share of the peak (memory-bound operations at HBM bandwidth)"


def ranking_data(ranking: RankingView) -> dict[str, Any]:
    """The ranking as JSON data: the search's counts and each choice's estimate."""
    return {
        "considered": ranking.considered,
        "pruned": ranking.pruned,
        "planned": ranking.planned,
        "unsearched": ranking.unsearched,
        "assumed": ranking.assumed,
        "pipeline_stages_searched": list(ranking.stages),  # by default, across granules
        # the winner with numerics the user did not choose: what -> its step seconds
        "other_numerics": dict(ranking.numerics),
        # the fastest pipelined mesh under 1F1B: its peak bytes and GPipe's at the same recipe
        "schedule_saves": None
        if ranking.schedule_saves is None
        else dict(zip(("1f1b_bytes", "gpipe_bytes"), ranking.schedule_saves, strict=True)),
        "choices": [
            {
                "ici_mesh_shape": list(c.ici),
                "dcn_mesh_shape": list(c.dcn),
                "beyond_headroom": c.beyond_headroom,
                **c.estimate.to_dict(),
            }
            for c in ranking
        ],
    }


def _why_sequence(choice: Any) -> str:
    """Why choice 1 cuts the sequence, where it does (the search leaves a sequence axis out
    where whole sequences fit: cost/choose/space.py's WHOLE)."""
    e, plan = choice.estimate, choice.plan
    seq = [a for a, t in e.axes.items() if t.role == "sequence" and e.mesh[a] > 1]
    if not seq or e.train is None:
        return ""
    c, batch = e.mesh[seq[0]], math.prod(e.mesh[a] for a in plan.batch_axis_names)
    slots = batch * c * (e.pipeline.stages if e.pipeline else 1)
    why = (
        f"{e.global_batch} sequences do not fill the {slots} sequence slots of the mesh without it"
        if e.global_batch % slots
        else "whole sequences fit no mesh without it with any recipe searched"
    )
    return f"sequence axis: choice 1 cuts each sequence {c} ways{_context(e)}: {why}"


def _context(e: Estimate) -> str:
    """ ", context ring" (and ", unbalanced") where the mesh has a sequence axis, else
    nothing: how attention crosses it (TrainSpec.context_strategy)."""
    split = any(t.role == "sequence" and e.mesh[a] > 1 for a, t in e.axes.items())
    if e.train is None or not split:
        return ""
    t = e.train
    return f", context {t.context_strategy}" + ", unbalanced" * (not t.context_load_balance)


def _precision(e: Estimate) -> str:
    """ ", quantization fp8" where the recipe priced low-precision matmuls, else nothing."""
    q = "none" if e.train is None else e.train.quantization
    return "" if q == "none" else f", quantization {q}"


def estimate_text(e: Estimate, notes: list[str], *, seq_len: int | None = None) -> str:
    """One estimate's breakdown: memory terms and phases, compute, each axis's collectives;
    headed by the model, `seq_len` (the sequence length it priced, where given) and the batch."""
    mesh = shape_text(e.mesh)
    verdict = "does NOT fit" if e.verdict == DOES_NOT_FIT else e.verdict
    if e.verdict == UNSURE:
        verdict += ": compile to confirm"
    host = "?" if e.host_memory_bytes is None else size_text(e.host_memory_bytes)
    band = memory_band(e.profile.platform)
    lines = [
        f"estimate   {_workload(e.model, seq_len, e.global_batch)} on {e.hardware}",
        f"recipe     remat {e.remat}, microbatches {e.microbatches}, logits chunks "
        f"{e.logits_chunks}" + (f", moe {e.moe}" if e.moe else "") + _precision(e) + _context(e),
        f"mesh       {mesh}",
        *(f"given      {k} = {v} ({GIVEN})" for k, v in e.given.items()),
        *(f"note       {n}" for n in notes),
        "",
        f"memory     {size_text(e.memory_bytes)} per device of {size_text(e.hbm_bytes)}, host "
        f"{size_text(e.host_bytes)} of {host}: {verdict}",
        *(
            [f"           {gpu_pool_text(e.hbm_bytes)}"]
            if e.profile.traits.preallocated_pool
            else []
        ),
        *([f"           ({band.text()})"] if band is not None and e.verdict != FITS else []),
        *([f"confirm    {e.confirm}"] if e.confirm else []),
        "           "
        + ", ".join(f"{k} {size_text(v)}" for k, v in e.memory.items() if v)
        + f" (live at the peak: the {max(e.phases, key=lambda p: e.phases[p])})",
        "           phases: " + ", ".join(f"{k} {size_text(v)}" for k, v in e.phases.items()),
        f"compute    {e.flops:.3e} FLOPs a device ({e.recompute_flops:.3e} recomputed), "
        f"{e.compute_seconds * 1e3:.1f} ms {_compute_rates(e)}",
    ]
    if e.pipeline is not None:
        p, a = e.pipeline, e.axes.get(e.pipeline.axis)
        moved = "" if a is None else f"; {size_text(a.bytes)} a step over the pipeline axis"
        block = ", one checkpoint an iteration" * (p.remat == "iteration")
        if p.schedule == "1f1b":
            block += ", 1F1B" if p.repeats == 1 else ", interleaved 1F1B"
        lines.append(
            f"pipeline   {p.stages} stages x {p.repeats} repeat{'s' * (p.repeats > 1)} of "
            f"{p.per_chunk} layer{'s' * (p.per_chunk > 1)} ({p.layers} pipelined), "
            f"{p.microbatches} micro-batches{block}: {p.iterations} iterations, "
            f"bubble {p.bubble:.1%} "
            f"(S - 1) / (M R + S - 1){moved}"
        )
    if e.offload_bytes:
        lines.append(
            f"offload    {size_text(e.offload_bytes)} each way over the host link, "
            f"{e.offload_seconds * 1e3:.1f} ms, {e.offload_exposed_seconds * 1e3:.1f} ms exposed"
        )
    rows: list[list[Any]] = [["axis", "role", "ici x dcn", "bytes", "across granules", "time"]]
    for a in e.axes.values():
        if a.bytes:
            rows.append(
                [
                    a.axis,
                    a.role,
                    f"{a.ici} x {a.dcn}",
                    size_text(a.bytes),
                    size_text(a.across_granules),
                    f"{a.seconds * 1e3:.1f} ms"
                    + (f" ({a.exposed_seconds * 1e3:.1f} exposed)" if a.exposed_seconds else ""),
                ]
            )
    if len(rows) > 1:
        lines += ["", text_table(rows), ""]
    lines += [
        f"step       {e.step_seconds * 1e3:.1f} ms; {e.tokens_per_second:,.0f} tokens/s a device;"
        f" MFU {e.mfu:.2f}; bottleneck: {e.bottleneck}",
        *(f"assumes    {a}" for a in e.assumes),
        f"overlap    {e.overlap}",
    ]
    return "\n".join(lines)
