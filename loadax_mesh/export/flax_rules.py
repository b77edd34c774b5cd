"""The plan as Flax logical axis rules (`flax.linen.logical_axis_rules`, `nnx` sharding
metadata): the logical axes of the reference step (docs/design.md section 7) mapped onto the plan's
own mesh axes, to use with the plan's own `Mesh`, so the ring order is kept.

`batch` -> the batch axes; `length` -> the sequence axis; `embed` (the d_model dim of weights)
-> the fsdp axis, the sequence axis (context parallelism shards the weights as fsdp does) and
the expert axis (which acts as fsdp outside the experts, as in MaxText);
`heads`, `kv_heads`, `mlp`, `vocab` -> the tensor-parallel axis; `kv` (the per-head dim) is
never sharded; `exp` (the expert dim of MoE weights) -> the expert axis; `embed_no_exp` (the
d_model dim of expert weights, MaxText's name) -> the fsdp and sequence axes;
`stage` (the stage dim of pipelined weights [repeats, stages, layers, ...], the step's
`stages.staged_shapes`, MaxText's `layers` -> `stage`) -> the pipeline axis. A role the plan
lacks (or of size 1) maps to None.

`batch` is the plan's batch axes, as inside a pipeline stage; outside the pipelined layers the
reference step also splits the batch over the pipeline axis (MaxText's rules for the layers it
does not pipeline do the same), which one table of rules cannot say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .axes import named_roles, quantization_notes

if TYPE_CHECKING:
    from ..view.picture import PlanView

LOGICAL_AXES = (
    "batch",
    "length",
    "embed",
    "heads",
    "kv_heads",
    "kv",
    "mlp",
    "vocab",
    "exp",
    "embed_no_exp",
    "stage",
)
Rule = tuple[str, str | tuple[str, ...] | None]


def to_flax_rules(plan: PlanView) -> tuple[Rule, ...]:
    """(logical axis, mesh axis or axes or None) pairs, one per LOGICAL_AXES entry."""
    shape = plan.shape
    r = named_roles(plan, "to_flax_rules", "shards no logical axis")
    batch = tuple(a for a in r.batch if shape[a] > 1)
    model, fsdp, seq, expert, pipeline = (
        axis if axis is not None and shape[axis] > 1 else None
        for axis in (r.model, r.fsdp, r.seq, r.expert, r.pipeline)
    )
    weights = tuple(a for a in (fsdp, seq) if a is not None)
    embed = tuple(a for a in (*weights, expert) if a is not None)
    table: dict[str, str | tuple[str, ...] | None] = {
        "batch": batch[0] if len(batch) == 1 else (batch or None),
        "length": seq,
        "embed": embed[0] if len(embed) == 1 else (embed or None),
        "exp": expert,
        "embed_no_exp": weights[0] if len(weights) == 1 else (weights or None),
        "heads": model,
        "kv_heads": model,
        "kv": None,
        "mlp": model,
        "vocab": model,
        "stage": pipeline,
    }
    return tuple((name, table[name]) for name in LOGICAL_AXES)


def flax_notes(quantization: str = "none") -> list[str]:
    """What the rules do not say about the recipe: its precision (TrainSpec.quantization), for
    which logical axis rules have no entry."""
    return quantization_notes(quantization, "logical axis rules", "the model's dot_general")
