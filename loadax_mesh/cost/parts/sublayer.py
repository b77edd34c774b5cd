"""What the backward pass of one fully recomputed layer holds at once on TPU, one sublayer at a
time (libtpu's live buffers at its peak; docs/notes/2026-11-26-full-remat-one-sublayer.md)."""

from __future__ import annotations

from collections.abc import Iterable

from ...hardware.traits import PlatformTraits
from ...workload.layout import regathered_weights
from ...workload.spec import ModelSpec, TrainSpec, dtype_bytes


def counted_per_sublayer(train: TrainSpec, traits: PlatformTraits, tensor: int) -> bool:
    """Whether a layer's backward pass is counted one sublayer at a time: where the compiler
    holds one sublayer's buffers at a time (`PlatformTraits.one_sublayer_at_a_time`; over a
    tensor axis of size `tensor` > 1 only where `sublayer_over_tensor_axis`) and the pass
    rebuilds each sublayer (nothing but the layer's input kept on the device: full remat, or a
    recipe that offloads some of the rest)."""
    kept = any(p == "device" for t, p in train.placements.items() if t != "layer_input")
    cut = tensor > 1 and not traits.sublayer_over_tensor_axis
    return traits.one_sublayer_at_a_time and not kept and not cut


def recomputed_working(
    model: ModelSpec,
    sizes: dict[str, int],
    m: int,
    compute_dtype: str,
    regathered: tuple[str, ...] = (),
    *,
    weights: bool = True,
) -> int:
    """Bytes the backward pass of one recomputed layer holds at once, weights included; `sizes`:
    the bytes of each of its intermediates (`memory._intermediates`), as stored; `m`: the
    tensor axis's size; `regathered`: the projections (query, key, value) whose weights the step
    gathers again for their input gradient (`layout.regathered`); `weights`: count the weights
    as held one sublayer at a time (libtpu); without, the intermediates alone (XLA's GPU
    compiler holds the whole layer's weights: `memory.memory_terms` counts them).

    It differentiates one sublayer at a time, holding that sublayer's gathered weights and
    their gradient and the other sublayer's weights gathered ahead, but for those gathered
    again (the MLP's backward then holds the attention's output projection and whatever of q,
    k and v is not: GPT-3 175B at fsdp 256, 0.9 GB less); the attention's residuals
    (rotated q, keys and values, its output and log-sum-exp), which its backward reads; two
    d_model-wide arrays (the layer's input, the gradient flowing back); over a tensor axis,
    whose sublayers see them cut, also the sublayer's normalised input gathered whole, which
    its weights' gradient reads (MaxText-2023 128B on v5e-256, fsdp 16 x tensor 16: one
    bf16[16,2048,10240] all-gather live at the backward pass's peak). In the MLP's backward,
    the gradient of each input projection, and the projections' outputs the activation's
    derivative reads (SwiGLU: gate and up; GELU: up; ReLU: none, its sign rides the fused
    gradient); in the attention's, the residuals' gradients. The larger of the two, as libtpu's
    live buffers show it (MaxText-2023 16B on v5e, ReLU: one d_ff-wide buffer; LLaMA-3 8B on
    v5p, SwiGLU: four)."""

    def size(names: Iterable[str]) -> int:
        return sum(sizes.get(n, 0) for n in names)

    cd = dtype_bytes(compute_dtype) * weights
    mlp_weights = model.mlp_params(model.d_ff) // m * cd
    attention_weights = (model.layer_params - model.norms * model.d_model) // m * cd - mlp_weights
    key = "rotated k" if "rotated k" in sizes else "k"  # latent attention's k is rotated
    kv = ("gathered k", "gathered v") if "gathered k" in sizes else (key, "v")
    residuals = size(("rotated q", *kv, "attention", "attention logsumexp", "scores"))
    residuals += size(("probabilities",))
    stream = 2 * size(("input",))
    projections = ("gate", "up") if model.mlp == "swiglu" else ("up",)
    read = {"swiglu": projections, "gelu": ("up",), "relu": ()}[model.mlp]
    own = size(projections) + size(read)
    again = regathered_weights(model, regathered, m) * cd
    mlp = 2 * mlp_weights + attention_weights - again + own + residuals + stream
    # (a parallel block's MLP reads the attention's norm: `memory._found` has no MLP norm)
    mlp += size(("gathered mlp norm" if "mlp norm" in sizes else "gathered attention norm",))
    attention = 2 * attention_weights + mlp_weights + 2 * residuals + stream
    attention += size(("gathered attention norm",))
    return max(mlp, attention)
