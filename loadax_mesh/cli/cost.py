"""The CLI's cost-model faces: `estimate` (one estimate's breakdown) and `plan --strategy auto`
(the ranking `choose_mesh` gives, before the winner's plan): the flags they read; their text
is view/estimate.py's. The winner's recipe is passed on explicitly (`chosen`) to what runs it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import (
    UsageError,
    model_from_args,
    model_notes,
    print_json,
    train_fields,
    train_from_args,
)

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..cost import Ranking
    from ..plan import MeshPlan
    from ..workload import ModelSpec, TrainSpec


def specs(args: argparse.Namespace, chosen: TrainSpec | None = None) -> tuple[ModelSpec, TrainSpec]:
    """The model (at --seq-len, where given) and train spec the flags name (--model and
    --global-batch are required); `chosen`, where `--strategy auto` chose the recipe, is the
    train spec instead."""
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
    train = train_from_args(args) if chosen is None else chosen
    model = model_from_args(args)
    assert model is not None  # --model is given
    return model, train


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


def auto_config(args: argparse.Namespace) -> tuple[MeshConfig, Ranking, str]:
    """`--strategy auto`: the winner's config, the ranking (whose first choice's `train` is the
    recipe it won with), and a note saying so. The recipe fields given pin the search's."""
    from ..cost import choose_mesh
    from ..cost.choose.recipes import MOE_PATHS, PIPELINE_FIELDS, RECIPE_FIELDS
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
    fixed = {k: v for k, v in train_fields(args).items() if k in RECIPE_FIELDS}
    pins = {k: v for k, v in fixed.items() if k in PIPELINE_FIELDS}
    both = getattr(args, "moe", None) == "any" and bool(model.num_experts)
    recipes = [fixed | {"moe": p} for p in MOE_PATHS] if both else [fixed]
    ranking = choose_mesh(args.hardware, model, train, recipes=recipes, facts=given_facts(args))
    fields = ("remat", "microbatches", "logits_chunks") + ("moe",) * both
    if ranking[0].estimate.pipeline is not None:
        fields += ("pipeline_microbatches", "pipeline_repeats")
    searched = [f"--{k.replace('_', '-')}" for k in fields if k not in fixed]
    note = auto_note(ranking, searched, seq_len=model.seq_len)
    if pins and ranking.stages and ranking.with_pipeline is None:
        pinned = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in pins.items())
        note += (
            f"; no pipelined mesh was priced with {pinned} (stages x repeats must divide the "
            "pipelined layers, the micro-batches be at least the stages and divide the batch: "
            "the pruned counts above)"
        )
    return ranking[0].config, ranking, note


def estimate_command(
    args: argparse.Namespace, plan: MeshPlan, notes: list[str], chosen: TrainSpec | None
) -> int:
    """Print the estimate of the step the flags describe (`chosen`: `--strategy auto`'s
    recipe) on `plan`."""
    from ..cost import estimate
    from ..view.estimate import estimate_text

    model, train = specs(args, chosen)
    notes = [*notes, *model_notes(args)]
    e = estimate(plan, model, train, facts=given_facts(args))
    if args.format == "json":  # the estimate names the model; its sequence length beside it
        print_json({**e.to_dict(), "seq_len": model.seq_len, "notes": notes})
    else:
        print(estimate_text(e, notes, seq_len=model.seq_len))
    return 0
