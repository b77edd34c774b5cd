"""`loadax-mesh plan ... --format maxtext|axlearn|flax`: the plan (and, for MaxText, the recipe)
in another trainer's terms. Importing this module imports no jax; MaxText's and AXLearn's
device order is built with jax's mesh_utils only when printed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .args import UsageError

if TYPE_CHECKING:
    from ..plan import MeshPlan
    from ..workload.spec import ModelSpec, TrainSpec

EXPORT_FORMATS = ("maxtext", "axlearn", "flax")


# What `plan --format F` reads of the workload flags and --global-batch outside --strategy
# auto (which reads them all, to choose the mesh): the text and json reports read --global-batch
# (each host's rows); MaxText's keys carry the model, the batch and the recipe (--global-batch
# needed); AXLearn's and Flax's exports are the mesh alone.
FORMAT_READS = {
    "text": "--global-batch (each host's rows)",
    "json": "--global-batch (each host's rows)",
    "maxtext": "--global-batch (needed), --model and the recipe flags (--remat, --microbatches, "
    "--logits-chunks, --attention, --moe, --pipeline-*): MaxText's keys carry them",
    "axlearn": "none of them: the export is the mesh alone",
    "flax": "none of them: the export is the mesh alone",
}
FORMAT_HELP = (
    "text (the report) or json, which read --global-batch for each host's rows; or an export "
    "(docs/exports.md): maxtext, which needs --global-batch and takes --model and the recipe "
    "flags (MaxText's keys carry them), axlearn or flax, the mesh alone (no --global-batch or "
    "workload flag, except with --strategy auto, which reads them to choose the mesh)"
)


def refuse_unread_flags(args: argparse.Namespace) -> None:
    """`plan` reads the workload flags (and, for AXLearn and Flax, --global-batch) only where
    something uses them: given otherwise, say what the format reads."""
    given = [
        flag
        for flag, value, default in (
            ("--model", args.model, None),
            ("--remat", args.remat, None),
            ("--microbatches", args.microbatches, None),
            ("--logits-chunks", args.logits_chunks, None),
            ("--moe", args.moe, None),
            ("--attention", args.attention, "flash"),
            ("--fact", args.facts, []),
            ("--pipeline-microbatches", args.pipeline_microbatches, None),
            ("--pipeline-repeats", args.pipeline_repeats, None),
            ("--pipeline-layers", args.pipeline_layers, None),
            ("--pipeline-remat", args.pipeline_remat, None),
        )
        if value != default and (args.format != "maxtext" or flag == "--fact")
    ]
    if args.format in ("axlearn", "flax") and args.global_batch is not None:
        given.append("--global-batch")
    if given:
        raise UsageError(
            f"plan reads {given[0]} only with --strategy auto (to choose the mesh) or where the "
            f"format uses it; --format {args.format} reads {FORMAT_READS[args.format]}; "
            "`loadax-mesh estimate` and `loadax-mesh compile` take the workload flags for a "
            "given strategy"
        )


def train_from_args(args: argparse.Namespace) -> tuple[TrainSpec, ModelSpec | None]:
    """The recipe MaxText's keys carry: `--strategy auto`'s winner where it chose one, else the
    flags (--global-batch, --remat, --microbatches, --logits-chunks, --attention, --moe, and the
    --pipeline-* fields); the model from --model, if given."""
    from ..workload.spec import ModelSpec, TrainSpec, parse_remat
    from .cost import stages

    model = None if args.model is None else ModelSpec.from_name(args.model)
    chosen = getattr(args, "chosen_train", None)
    if chosen is not None:
        return chosen, model
    if args.global_batch is None:
        raise UsageError(
            "--format maxtext needs --global-batch N (MaxText's per_device_batch_size and "
            "gradient_accumulation_steps come from it)"
        )
    recipe: dict[str, Any] = {
        "remat": None if args.remat is None else parse_remat(args.remat),
        "microbatches": getattr(args, "microbatches", None),
        "logits_chunks": getattr(args, "logits_chunks", None),
        "moe": getattr(args, "moe", None),
    }
    given = {k: v for k, v in recipe.items() if v is not None} | stages(args)
    return TrainSpec(global_batch=args.global_batch, attention=args.attention, **given), model


def export_command(args: argparse.Namespace, plan: MeshPlan) -> int:
    """Print the export `args.format` names."""
    if args.format == "maxtext":
        train, model = train_from_args(args)
        print(plan.to_maxtext(train, model=model).text())
    elif args.format == "axlearn":
        print(plan.to_axlearn().text())
    else:
        rules = plan.to_flax_rules()
        print(
            f"# Flax logical axis rules for {plan.hardware}, mesh "
            + " x ".join(f"{a} {n}" for a, n in plan.shape.items())
            + "\n# use with the plan's own Mesh (MeshConfig.create_device_mesh): the ring order "
            "is kept\nrules = (\n"
            + "".join(f"    ({name!r}, {axis!r}),\n" for name, axis in rules)
            + ")"
        )
    return 0
