"""`loadax-mesh plan ... --format maxtext|axlearn|flax`: the plan (and, for MaxText, the recipe)
in another trainer's terms. Importing this module imports no jax; MaxText's and AXLearn's
device order is built with jax's mesh_utils only when printed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import UsageError, given_fields, model_from_args, train_from_args

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
    "maxtext": "--global-batch (needed), --model, --seq-len and the training flags (one for "
    "each TrainSpec field: --remat, --microbatches, --opt-state-dtype, --pipeline-*, ...): "
    "MaxText's keys carry them",
    "axlearn": "none of them: the export is the mesh alone",
    "flax": "none of them: the export is the mesh alone",
}
FORMAT_HELP = (
    "text (the report) or json, which read --global-batch for each host's rows; or an export "
    "(docs/exports.md): maxtext, which needs --global-batch and takes --model, --seq-len and "
    "the training flags (MaxText's keys carry them), axlearn or flax, the mesh alone (no "
    "--global-batch or workload flag, except with --strategy auto, which reads them to choose "
    "the mesh)"
)


def refuse_unread_flags(args: argparse.Namespace) -> None:
    """`plan` reads the workload flags (and, for AXLearn and Flax, --global-batch) only where
    something uses them: given otherwise, say what the format reads."""
    maxtext = args.format == "maxtext"
    given = ["--model"] * (args.model is not None and not maxtext)
    given += ["--seq-len"] * (args.seq_len is not None and not maxtext)
    given += [f"--{k.replace('_', '-')}" for k in given_fields(args) if not maxtext]
    given += ["--fact"] * bool(args.facts)
    if args.format in ("axlearn", "flax") and args.global_batch is not None:
        given.append("--global-batch")
    if given:
        raise UsageError(
            f"plan reads {given[0]} only with --strategy auto (to choose the mesh) or where the "
            f"format uses it; --format {args.format} reads {FORMAT_READS[args.format]}; "
            "`loadax-mesh estimate` and `loadax-mesh compile` take the workload flags for a "
            "given strategy"
        )


def maxtext_train(
    args: argparse.Namespace, chosen: TrainSpec | None
) -> tuple[TrainSpec, ModelSpec | None]:
    """The recipe MaxText's keys carry: `--strategy auto`'s winner where it chose one
    (`chosen`), else the flags' TrainSpec; the model from --model (at --seq-len), if given."""
    model = model_from_args(args)
    if chosen is not None:
        return chosen, model
    if args.global_batch is None:
        raise UsageError(
            "--format maxtext needs --global-batch N (MaxText's per_device_batch_size and "
            "gradient_accumulation_steps come from it)"
        )
    return train_from_args(args), model


def export_command(args: argparse.Namespace, plan: MeshPlan, chosen: TrainSpec | None) -> int:
    """Print the export `args.format` names (`chosen`: `--strategy auto`'s recipe, whose
    precision the AXLearn and Flax exports note)."""
    quantization = "none" if chosen is None else chosen.quantization
    if args.format == "maxtext":
        train, model = maxtext_train(args, chosen)
        print(plan.to_maxtext(train, model=model).text())
    elif args.format == "axlearn":
        print(plan.to_axlearn(quantization=quantization).text())
    else:
        from ..export.flax_rules import flax_notes

        rules = plan.to_flax_rules()
        print(
            f"# Flax logical axis rules for {plan.hardware}, mesh "
            + " x ".join(f"{a} {n}" for a, n in plan.shape.items())
            + "\n# use with the plan's own Mesh (MeshConfig.create_device_mesh): the ring order "
            "is kept\n"
            + "".join(f"# {note}\n" for note in flax_notes(quantization))
            + "rules = (\n"
            + "".join(f"    ({name!r}, {axis!r}),\n" for name, axis in rules)
            + ")"
        )
    return 0
