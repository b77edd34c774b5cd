"""The CLI's cost-model faces: `estimate` (one estimate's breakdown) and `plan --strategy auto`
(the ranking `choose_mesh` gives, before the winner's plan): the flags they read; their text
is view/estimate.py's."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .args import UsageError, print_json

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..cost import Ranking
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
    train = TrainSpec(
        global_batch=args.global_batch, attention=args.attention, **recipe(args), **stages(args)
    )
    return ModelSpec.from_name(args.model), train


def given_facts(args: argparse.Namespace) -> dict[str, str] | None:
    """The facts `--fact NAME=VALUE` sets (checked where the hardware's profile reads them)."""
    from ..hardware.given import parse_fact_flag

    found: dict[str, str] = {}
    for item in args.facts:
        name, value = parse_fact_flag(item)
        if name in found:
            raise UsageError(f"--fact {name} is given twice ({found[name]}, {value})")
        found[name] = value
    return found or None


def stages(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline fields the flags give (--pipeline-microbatches, -repeats, -layers,
    -remat)."""
    names = ("pipeline_microbatches", "pipeline_repeats", "pipeline_layers", "pipeline_remat")
    return {k: v for k in names if (v := getattr(args, k, None)) is not None}


def recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe fields the flags give (--remat, --microbatches, --logits-chunks, --moe)."""
    from ..workload.spec import parse_remat

    given = {
        "remat": None if args.remat is None else parse_remat(args.remat),
        "microbatches": args.microbatches,
        "logits_chunks": args.logits_chunks,
        "moe": getattr(args, "moe", None),
    }
    return {k: v for k, v in given.items() if v is not None}


def auto_config(args: argparse.Namespace) -> tuple[MeshConfig, Ranking, str]:
    """`--strategy auto`: the winner's config, the ranking, and a note saying so."""
    from ..cost import choose_mesh
    from ..cost.choose.recipes import PIPELINE_FIELDS
    from ..view.estimate import auto_note

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
    pins = {k: v for k, v in stages(args).items() if k in PIPELINE_FIELDS}
    fixed = recipe(args) | pins  # the pipeline's fields given pin the search's
    ranking = choose_mesh(args.hardware, model, train, recipes=[fixed], facts=given_facts(args))
    args.chosen_train = ranking[0].train  # what estimate and compile then run
    fields = ("remat", "microbatches", "logits_chunks") + ("moe",) * bool(model.num_experts)
    if ranking[0].estimate.pipeline is not None:
        fields += ("pipeline_microbatches", "pipeline_repeats")
    searched = [f"--{k.replace('_', '-')}" for k in fields if k not in fixed]
    note = auto_note(ranking, searched)
    if pins and ranking.stages and ranking.with_pipeline is None:
        pinned = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in pins.items())
        note += (
            f"; no pipelined mesh was priced with {pinned} (stages x repeats must divide the "
            "pipelined layers, the micro-batches be at least the stages and divide the batch: "
            "the pruned counts above)"
        )
    return ranking[0].config, ranking, note


def estimate_command(args: argparse.Namespace, plan: MeshPlan, notes: list[str]) -> int:
    from ..cost import estimate
    from ..view.estimate import estimate_text

    model, train = specs(args)
    e = estimate(plan, model, train, facts=given_facts(args))
    if args.format == "json":
        print_json({**e.to_dict(), "notes": notes})
    else:
        print(estimate_text(e, notes))
    return 0
