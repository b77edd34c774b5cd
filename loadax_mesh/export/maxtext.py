"""The plan and recipe as MaxText config keys (its `base.yml`), in the `key=value` form its
command line takes (`python -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml
key=value ...`).

Facts from MaxText (commit e591f30, src/maxtext/configs/base.yml, configs/types.py,
layers/decoders.py): mesh degrees are `ici_<axis>_parallelism` and `dcn_<axis>_parallelism`;
`per_device_batch_size` is per micro-batch (global batch = per_device_batch_size x devices x
gradient_accumulation_steps) and may be a fraction; `remat_policy=custom` places each named
tensor of a decoder layer with `remat`, `device` or `offload`; `num_vocab_tiling` computes the
loss in chunks; MaxText builds its mesh with jax's `mesh_utils`. MoE (base.yml,
docs/reference/core_concepts/moe_configuration.md): the `expert` axis shards the experts and
acts as fsdp elsewhere; `sparse_matmul=true` is the dropless grouped-matmul path (`megablox`
its TPU kernel), `sparse_matmul=false` with `capacity_factor` > 0 the dropping one;
`use_random_routing` forces spread routing. `quantization=fp8_full` (qwix's rule, with
`use_qwix_quantization`) or `int8`: docs/facts/low_precision.md. The pipeline axis:
maxtext_pipeline.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError
from ..hardware.traits import attention_kernel, platform_traits
from ..workload.layout import Roles, check_modelled
from ..workload.model import ModelSpec
from .axes import named_roles, trainer_axes
from .maxtext_context import context_keys
from .maxtext_numerics import numerics_keys
from .maxtext_pipeline import pipeline_keys
from .order import OrderComparison, compare_order

if TYPE_CHECKING:
    from ..view.picture import PlanView
    from ..workload.spec import TrainSpec

# MaxText's default mesh_axes (base.yml), in its order; the plan's roles map onto four of them.
MESH_AXES = (
    "diloco",
    "data",
    "stage",
    "fsdp",
    "fsdp_transpose",
    "context",
    "context_usp_ulysses",
    "context_autoregressive",
    "tensor",
    "tensor_sequence",
    "expert",
    "autoregressive",
)
# Our role -> MaxText's axis; the word its ici_/dcn_ keys use is the axis's, but for `stage`.
_ROLE_AXIS = {
    "fsdp": "fsdp",
    "model": "tensor",
    "seq": "context",
    "expert": "expert",
    "pipeline": "stage",
}
_KEY_WORD = {"stage": "pipeline"}
# Our named tensors -> MaxText's `custom` remat keys (checkpoint_name in its llama2 decoder
# layer, attentions.py and linears.py); mlp_in is both SwiGLU inputs, wi_0 and wi_1 (a
# two-matrix MLP's one input is wi: TWO_MATRIX_MLP_IN).
REMAT_KEYS = {
    "layer_input": ("decoder_layer_input",),
    "query": ("query_proj",),
    "key": ("key_proj",),
    "value": ("value_proj",),
    "attention_out": ("attention_out",),
    "out_proj": ("out_proj",),
    "mlp_in": ("mlpwi_0", "mlpwi_1"),
    "mlp_out": ("mlpwo",),
}
TWO_MATRIX_MLP_IN = ("mlpwi",)
_PLACEMENT = {"recompute": "remat", "device": "device", "offload": "offload"}
# ModelSpec.mlp -> MaxText's mlp_activations (linears.py's MlpBlock: one activation is a
# two-matrix MLP, "silu" times "linear" SwiGLU; its "gelu" is flax's tanh approximation, as the
# step's).
MLP_ACTIVATIONS = {"swiglu": "['silu','linear']", "relu": "['relu']", "gelu": "['gelu']"}
# Our models that MaxText ships under the same name (src/maxtext/configs/models/*.yml).
MODELS = ("llama2-7b", "llama3-8b", "llama3-70b", "llama3-405b")
# Our MoE models -> MaxText's config of the same model (DeepSeek-V3's with latent attention).
MOE_MODELS = {
    "deepseek-v3": "deepseek3-671b",
    "mixtral-8x7b": "mixtral-8x7b",
    "mixtral-8x22b": "mixtral-8x22b",
    "qwen3-235b-a22b": "qwen3-235b-a22b",
    "llama4-scout-17b-16e": "llama4-17b-16e",
    "llama4-maverick-17b-128e": "llama4-17b-128e",
}
# A shipped model resized (fewer layers to compile quickly, another width): our field -> the
# MaxText key that overrides its config (with override_model_config=true).
RESIZE_KEYS = {
    "num_layers": "base_num_decoder_layers",
    "d_model": "base_emb_dim",
    "d_ff": "base_mlp_dim",
    "moe_d_ff": "base_moe_mlp_dim",
    "num_heads": "base_num_query_heads",
    "num_kv_heads": "base_num_kv_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "num_experts": "num_experts",
    "experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "shared_experts",
    "first_dense_layers": "first_num_dense_layers",
    "routed_scaling": "routed_scaling_factor",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}


@dataclass(frozen=True)
class MaxTextConfig:
    """MaxText config keys for a plan and recipe, with what does not travel."""

    keys: dict[str, str]
    notes: tuple[str, ...]
    order: OrderComparison | None = field(default=None, compare=False)

    def args(self) -> list[str]:
        """The keys as MaxText's command line takes them: `key=value`."""
        return [f"{k}={v}" for k, v in self.keys.items()]

    def text(self) -> str:
        """Comments saying what does not travel, then one `key=value` per line."""
        lines = [f"# {n}" for n in self.notes]
        if self.order is not None:
            lines += [f"# {line}" for line in self.order.lines("MaxText")]
        return "\n".join([*lines, *self.args()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": dict(self.keys),
            "args": self.args(),
            "notes": list(self.notes),
            "order": None if self.order is None else self.order.to_dict(),
        }


def _axis_map(plan: PlanView) -> tuple[dict[str, str], Roles]:
    """Plan axis (size > 1) -> MaxText axis, and the plan's roles; a plan MaxText cannot
    express is refused."""
    r = named_roles(
        plan, "to_maxtext", "has no MaxText name", batch=" (-> data, fsdp)",
        named=" (-> fsdp, tensor, context, expert, stage)",
    )  # fmt: skip
    out = trainer_axes(plan, r, _ROLE_AXIS, "to_maxtext")
    for axis, their in out.items():
        batch = axis in plan.batch_axis_names
        if their in ("tensor", "context", "stage") and batch:
            does = "runs the pipelined layers one stage after the other, not on parts of the batch"
            raise MeshConfigError(
                f"to_maxtext: mesh axis {axis!r} is a batch axis, but MaxText's {their} axis "
                + (does if their == "stage" else "does not split the batch")
                + "; accepted: batch axes that are data or fsdp axes"
            )
        if their == "fsdp" and not batch:
            raise MeshConfigError(
                f"to_maxtext: the fsdp axis {axis!r} is no batch axis, but MaxText always splits "
                "the batch over fsdp; accepted: a plan whose batch axes include it"
            )
    return out, r


def _batch(plan: PlanView, train: TrainSpec) -> str:
    """per_device_batch_size: rows per device per micro-batch (a fraction where < 1)."""
    n = plan.devices.size
    per_micro = train.global_batch // train.microbatches
    if per_micro % plan.data_parallel_size:
        raise MeshConfigError(
            f"to_maxtext: a micro-batch of {per_micro} rows (global_batch={train.global_batch}, "
            f"microbatches={train.microbatches}) does not divide over the batch axes' "
            f"{plan.data_parallel_size} shards; accepted: micro-batches of a multiple of "
            f"{plan.data_parallel_size} rows"
        )
    value = per_micro / n  # MaxText takes int(devices x per_device_batch_size) back
    return str(int(value)) if value == int(value) else repr(value)


def _remat(train: TrainSpec, model: ModelSpec | None) -> dict[str, str]:
    if train.remat == "full":
        return {"remat_policy": "full"}
    keys = {"remat_policy": "custom"}
    two_matrix = model is not None and model.mlp != "swiglu"
    for tensor, placement in train.placements.items():
        names = TWO_MATRIX_MLP_IN if two_matrix and tensor == "mlp_in" else REMAT_KEYS[tensor]
        for key in names:
            keys[key] = _PLACEMENT[placement]
    return keys


def _moe(train: TrainSpec, platform: str) -> dict[str, str]:
    """The MoE keys of `train`: dropless as sparse grouped matmuls (megablox on TPU), capacity
    as the dropping path; balanced routing as MaxText's forced (random) routing. The step
    shards the experts' d_model over fsdp (layout.py), MaxText's default layout, so
    `shard_exp_on_fsdp` stays off."""
    dropless = train.moe == "dropless"
    keys = {
        "sparse_matmul": str(dropless).lower(),
        "megablox": str(dropless and platform_traits(platform).mosaic_kernels).lower(),
        "capacity_factor": "-1" if dropless else repr(float(train.capacity_factor)),
    }
    if train.routing == "balanced":
        keys["use_random_routing"] = "true"
    return keys


def _resized(model: ModelSpec) -> dict[str, str]:
    """The keys that resize MaxText's config of a shipped model to `model` (none when equal)."""
    shipped = ModelSpec.from_name(model.name)
    changed = [
        f.name
        for f in fields(model)
        if f.name not in ("seq_len", "source")
        and getattr(model, f.name) != getattr(shipped, f.name)
    ]
    if model.attention == "mla":  # MaxText's MLA heads are qk_nope + qk_rope wide, not head_dim
        changed = [f for f in changed if f != "head_dim"]
    if not changed:
        return {}
    if other := [f for f in changed if f not in RESIZE_KEYS]:
        raise MeshConfigError(
            f"model {model.name!r}: {', '.join(f'{f}={getattr(model, f)!r}' for f in other)} "
            f"differ from the shipped model and have no MaxText key in the export; accepted: "
            f"changes to {', '.join(RESIZE_KEYS)}"
        )
    return {"override_model_config": "true"} | {
        RESIZE_KEYS[f]: str(getattr(model, f)) for f in changed
    }


def _model(model: ModelSpec) -> dict[str, str]:
    # its keys below spell a dense model, or MaxText's own config of a MoE model (resized)
    check_modelled(model, by="the MaxText export", experts=True, latent=True)
    if model.parallel_block:  # MaxText's decoder blocks today are sequential; no key says so
        raise MeshConfigError(
            f"model {model.name!r}: parallel_block=True has no MaxText key (its decoder layers "
            "run attention and the MLP one after the other; its 2023 parallel layer is gone); "
            "accepted: parallel_block=False, or the export without a model"
        )
    keys = {"max_target_length": str(model.seq_len)}
    if model.name in MODELS:
        return {"model_name": model.name, **_resized(model), **keys}
    if model.num_experts:
        if model.name not in MOE_MODELS:
            raise MeshConfigError(
                f"model {model.name!r}: num_experts={model.num_experts} in a model MaxText does "
                "not ship is not modelled yet by the MaxText export; accepted: dense models, or "
                f"the MoE models {', '.join(MOE_MODELS)}"
            )
        return {"model_name": MOE_MODELS[model.name], **_resized(model), **keys}
    if model.sliding_window:  # the keys below spell full attention in every layer
        raise MeshConfigError(
            f"model {model.name!r}: sliding_window={model.sliding_window} in a model MaxText "
            "does not ship has no key in the export yet (MaxText's sliding_window_size is its "
            "Gemma and GPT-OSS decoder blocks'); accepted: sliding_window=0"
        )
    if model.attention == "mla":
        raise MeshConfigError(
            f"model {model.name!r}: attention='mla' in a model MaxText does not ship is not "
            f"modelled yet by the MaxText export; accepted: GQA models, or MaxText's deepseek-v3"
        )
    return {
        "base_num_decoder_layers": str(model.num_layers),
        "base_emb_dim": str(model.d_model),
        "base_mlp_dim": str(model.d_ff),
        "base_num_query_heads": str(model.num_heads),
        "base_num_kv_heads": str(model.num_kv_heads),
        "head_dim": str(model.head_dim),
        "vocab_size": str(model.vocab_size),
        "mlp_activations": MLP_ACTIVATIONS[model.mlp],
        "logits_via_embedding": str(model.tied_embeddings).lower(),
        # MaxText divides tied logits by sqrt(d_model) unless told not to; the step does not.
        **({"normalize_embedding_logits": "false"} if model.tied_embeddings else {}),
        "enable_dropout": "false",
        **keys,
    }


def to_maxtext(
    plan: PlanView,
    train: TrainSpec,
    *,
    model: ModelSpec | str | None = None,
    order: bool = True,
) -> MaxTextConfig:
    """The MaxText keys for `plan` and `train` (and `model`'s shape, when given: a ModelSpec
    or a catalogue name); `order` compares MaxText's device order (jax's mesh_utils, which
    imports jax) with the plan's."""
    if model is not None and not isinstance(model, ModelSpec):
        model = ModelSpec.from_name(model)  # a MeshConfigError naming the model if unknown
    if train.opt_state_dtype != train.param_dtype:
        raise MeshConfigError(
            f"to_maxtext: opt_state_dtype={train.opt_state_dtype!r} with param_dtype="
            f"{train.param_dtype!r}: MaxText keeps Adam's second moment in weight_dtype (only "
            "mu_dtype is a key); accepted: opt_state_dtype equal to param_dtype"
        )
    axes, r = _axis_map(plan)
    moe = (model is not None and model.num_experts > 0) or "expert" in plan.shape
    staged, stage_notes = pipeline_keys(r, train, model)
    extra = ("expert",) * moe + ("stage",) * bool(staged)
    keys: dict[str, str] = {}
    for level, sizes in (("ici", plan.ici_mesh_shape), ("dcn", plan.dcn_mesh_shape)):
        degree = dict.fromkeys(("data", "fsdp", "tensor", "context", *extra), 1)
        for name, size in zip(plan.axis_names, sizes, strict=True):
            if name in axes:
                degree[axes[name]] = size
        keys.update(
            {f"{level}_{_KEY_WORD.get(a, a)}_parallelism": str(d) for a, d in degree.items()}
        )
    attention = attention_kernel(train.attention, str(plan.table.platform))
    quantized, quantized_notes = numerics_keys(train)
    keys.update(
        {
            "per_device_batch_size": _batch(plan, train),
            "gradient_accumulation_steps": str(train.microbatches),
            "num_vocab_tiling": str(train.logits_chunks),
            "weight_dtype": train.param_dtype,
            "dtype": train.compute_dtype,
            "attention": {"splash": "flash", "cudnn": "cudnn_flash_te"}.get(
                attention, "dot_product"
            ),
            **_remat(train, model),
            **staged,
            **(_moe(train, str(plan.table.platform)) if moe else {}),
            **({} if model is None else _model(model)),
            **quantized,
            **(
                context_keys(train, str(plan.table.platform), r.size("seq"), model)
                if "context" in axes.values()
                else {}
            ),
        }
    )
    notes = [
        f"MaxText config for {plan.hardware}: mesh "
        + ", ".join(f"{a} -> {t}" for a, t in axes.items())
        + (" (all size 1)" if not axes else ""),
        "lost: the device order; MaxText builds its mesh with jax's mesh_utils over its own "
        "axis order (ring quality below)",
        *stage_notes,
        *quantized_notes,
    ]
    if moe and train.moe == "dropless":
        notes.append(
            "approximate: the reference step's dropless experts are jax.lax.ragged_dot grouped "
            "matmuls; MaxText's sparse_matmul runs the same products (megablox: its TPU kernel)"
        )
    if moe and train.routing == "balanced":
        notes.append(
            "approximate: routing='balanced' (token i to experts i*k+j mod E) as "
            "use_random_routing=true, MaxText's forced routing (random, balanced on average)"
        )
    if train.remat in ("dots", "none"):
        notes.append(
            f"approximate: remat {train.remat!r} as custom keys; MaxText recomputes the "
            "intermediates it does not name (norms, activations)"
        )
    notes.append(
        "approximate: MaxText trains with AdamW (weight decay 0.1, gradient clipping 1.0); "
        "memory is the same"
    )
    comparison = None
    if order:
        mesh_axes = list(MESH_AXES)
        if staged:  # MaxText puts stage before data when it pipelines (configs/types.py)
            i, j = mesh_axes.index("stage"), mesh_axes.index("data")
            mesh_axes[i], mesh_axes[j] = mesh_axes[j], mesh_axes[i]
        comparison = compare_order(
            plan,
            {a: mesh_axes.index(t) for a, t in axes.items()},
            len(mesh_axes),
            process_is_granule=plan.granule_kind == "process",
        )
        if comparison.split and comparison.theirs is not None:
            keys["allow_split_physical_axes"] = "true"
            notes.append(
                "allow_split_physical_axes=true: mesh_utils refuses these degrees on whole "
                "physical axes"
            )
    return MaxTextConfig(keys=keys, notes=tuple(notes), order=comparison)
