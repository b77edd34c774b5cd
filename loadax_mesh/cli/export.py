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


def train_from_args(args: argparse.Namespace) -> tuple[TrainSpec, ModelSpec | None]:
    """The recipe MaxText's keys carry: `--strategy auto`'s winner where it chose one, else the
    flags (--global-batch, --remat, --microbatches, --logits-chunks, --attention); the model
    from --model, if given."""
    from ..workload.spec import ModelSpec, TrainSpec, parse_remat

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
    }
    given = {k: v for k, v in recipe.items() if v is not None}
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
