"""The CLI's cost-model faces: `estimate` (one estimate's breakdown) and `plan --strategy auto`
(the ranking `choose_mesh` gives, before the winner's plan)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..view.picture import shape_text
from .args import UsageError, print_json, size_text

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..cost import Estimate, Ranking
    from ..plan import MeshPlan
    from ..workload import ModelSpec, TrainSpec


def specs(args: argparse.Namespace) -> tuple[ModelSpec, TrainSpec]:
    """The model and train spec the flags name (--model and --global-batch are required)."""
    from ..workload import ModelSpec, TrainSpec

    missing = [
        f
        for f, v in (("--model M", args.model), ("--global-batch B", args.global_batch))
        if v is None
    ]
    if missing:
        who, why = {
            "plan": ("plan --strategy auto", "to choose the mesh"),
            "estimate": ("estimate", "for the estimate"),
        }.get(args.command, (args.command, "for the step it compiles"))
        raise UsageError(f"{who} needs {' and '.join(missing)} ({why})")
    chosen = getattr(args, "chosen_train", None)  # --strategy auto: the winner's recipe
    if chosen is not None:
        return ModelSpec.from_name(args.model), chosen
    train = TrainSpec(global_batch=args.global_batch, attention=args.attention, **recipe(args))
    return ModelSpec.from_name(args.model), train


def recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe fields the flags give (--remat, --microbatches, --logits-chunks)."""
    from ..workload.spec import parse_remat

    given = {
        "remat": None if args.remat is None else parse_remat(args.remat),
        "microbatches": args.microbatches,
        "logits_chunks": args.logits_chunks,
    }
    return {k: v for k, v in given.items() if v is not None}


def auto_config(args: argparse.Namespace) -> tuple[MeshConfig, Ranking, str]:
    """`--strategy auto`: the winner's config, the ranking, and a note saying so."""
    from ..cost import choose_mesh

    if args.hardware is None:
        raise UsageError("--strategy auto needs a catalogue HARDWARE string (its facts)")
    given = [
        f for f in ("shape", "dcn_shape", "axes", "batch_axes") if getattr(args, f) is not None
    ]
    given += ["set"] * bool(args.overrides) + ["granule"] * (args.granule != "auto")
    if given:
        flag = given[0].replace("_", "-")
        raise UsageError(
            f"--strategy auto chooses the shape and plans on the hardware's own granules; drop "
            f"--{flag}"
        )
    model, train = specs(args)
    fixed = recipe(args)
    ranking = choose_mesh(args.hardware, model, train, recipes=[fixed])
    args.chosen_train = ranking[0].train  # what estimate and compile then run
    searched = [f"--{f.replace('_', '-')}" for f in ("remat", "microbatches", "logits_chunks")]
    searched = [f for f, k in zip(searched, ("remat", "microbatches", "logits_chunks"), strict=True)
                if k not in fixed]  # fmt: skip
    what = f" and recipes ({', '.join(searched)} searched)" if searched else ""
    return (
        ranking[0].config,
        ranking,
        f"strategy auto: the fastest of {ranking.considered} meshes{what}; recipe "
        f"{recipe_text(ranking[0].train)}",
    )


def recipe_text(train: TrainSpec) -> str:
    """A recipe as the command line writes it: remat, micro-batches, logits chunks."""
    return (
        f"remat {train.remat_text}, microbatches {train.microbatches}, "
        f"logits chunks {train.logits_chunks}"
    )


def ranking_text(ranking: Ranking) -> str:
    """The ranking as a table: shape, ICI x DCN, memory against HBM, step time, MFU."""
    from ..view.report import text_table

    header = ["", "mesh", "ici x dcn", "recipe", "memory", "host", "step", "MFU", "bottleneck"]
    rows: list[list[Any]] = [header]
    for k, c in enumerate(ranking, 1):
        e = c.estimate
        rows.append(
            [
                f"{k}.",
                shape_text(e.mesh, drop_ones=True) or "1 device",
                f"{_shape(c.ici)} x {_shape(c.dcn)}",
                f"{e.remat} x{e.microbatches}" + (f" /{e.logits_chunks}" * (e.logits_chunks > 1)),
                f"{e.memory_bytes / 1e9:.1f} / {e.hbm_bytes / 1e9:.1f} GB",
                f"{e.host_bytes / 1e9:.1f} GB" if e.host_bytes else "-",
                f"{e.step_seconds:.3f} s",
                f"{e.mfu:.2f}",
                e.bottleneck,
            ]
        )
    pruned = ", ".join(f"{n} {why}" for why, n in ranking.pruned.items()) or "none"
    return (
        f"ranking    {ranking.considered} shapes x ICI/DCN splits considered; pruned: {pruned}; "
        f"{ranking.planned} planned on the real rings; recipe: remat x micro-batches "
        f"[/ logits chunks]\n{text_table(rows)}"
    )


def ranking_data(ranking: Ranking) -> dict[str, Any]:
    return {
        "considered": ranking.considered,
        "pruned": ranking.pruned,
        "planned": ranking.planned,
        "choices": [
            {"ici_mesh_shape": list(c.ici), "dcn_mesh_shape": list(c.dcn), **c.estimate.to_dict()}
            for c in ranking
        ],
    }


def estimate_command(args: argparse.Namespace, plan: MeshPlan, notes: list[str]) -> int:
    from ..cost import estimate

    model, train = specs(args)
    e = estimate(plan, model, train)
    if args.format == "json":
        print_json({**e.to_dict(), "notes": notes})
    else:
        print(estimate_text(e, notes))
    return 0


def estimate_text(e: Estimate, notes: list[str]) -> str:
    """One estimate's breakdown: memory terms and phases, compute, each axis's collectives."""
    from ..view.report import text_table

    mesh = shape_text(e.mesh)
    verdict = "fits" if e.fits else "does NOT fit"
    host = "?" if e.host_memory_bytes is None else size_text(e.host_memory_bytes)
    lines = [
        f"estimate   {e.model}, global batch {e.global_batch} on {e.hardware}",
        f"recipe     remat {e.remat}, microbatches {e.microbatches}, logits chunks "
        f"{e.logits_chunks}",
        f"mesh       {mesh}",
        *(f"note       {n}" for n in notes),
        "",
        f"memory     {size_text(e.memory_bytes)} per device of {size_text(e.hbm_bytes)}, host "
        f"{size_text(e.host_bytes)} of {host}: {verdict}",
        "           "
        + ", ".join(f"{k} {size_text(v)}" for k, v in e.memory.items() if v)
        + f" (live at the peak: the {max(e.phases, key=lambda p: e.phases[p])})",
        "           phases: " + ", ".join(f"{k} {size_text(v)}" for k, v in e.phases.items()),
        f"compute    {e.flops:.3e} FLOPs a device ({e.recompute_flops:.3e} recomputed), "
        f"{e.compute_seconds * 1e3:.1f} ms at peak",
    ]
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
        f"overlap    {e.overlap}",
    ]
    return "\n".join(lines)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, shape)) + ")"
