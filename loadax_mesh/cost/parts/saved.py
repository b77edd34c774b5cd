"""What a layer keeps for its backward pass: the intermediates each named tensor of the recipe
is, and, with no checkpoint at all, what jax's autodiff itself saves (cost/memory/terms.py sums
them).
"""

from __future__ import annotations

from ...workload.spec import ModelSpec, TrainSpec
from . import mla
from .moe import moe_residuals

# The intermediates each named tensor of a layer (workload.spec.TENSORS) is, as the step names
# them with checkpoint_name: the projections' outputs before the rotary embedding, the attention
# kernel's output, the output projection, the MLP's input projections (SwiGLU's gate and up; a
# two-matrix MLP's up alone). Not the down projection's output: it feeds only the residual
# add, whose backward pass reads no input, so autodiff saves (and recomputes) none of it under
# any placement (jax's print_saved_residuals; the compiled MaxText-2023 32B step on v5p-128
# stores stacks of the layer input and the output projection, none of the down projection).
PARTS = {
    "layer_input": ("input",),
    "query": ("q",),
    "key": ("k",),
    "value": ("v",),
    "attention_out": ("attention",),
    "out_proj": ("attention projection",),
    "mlp_in": ("gate", "up"),
    "mlp_out": (),
}


def parts(tensor: str, *, parallel: bool = False) -> tuple[str, ...]:
    """`PARTS[tensor]`; in a parallel block (`ModelSpec.parallel_block`) the output projection,
    like the down projection, only feeds the sum added to the residual: nothing keeps it."""
    return () if parallel and tensor == "out_proj" else PARTS[tensor]


def recomputed(train: TrainSpec, *, moe: bool = False, parallel: bool = False) -> tuple[str, ...]:
    """The named tensors whose op a layer's backward pass runs again: those the placement
    recomputes that the backward pass reads. A dense layer's down projection is never run
    again (PARTS: nothing reads its output), nor a parallel block's output projection
    (`parallel`); a MoE layer's down projection is, as its combine's gradient for
    the routing weights reads the experts' outputs (jaxprs of the reference step's gradient
    under "full", "dots", "dots_attention" and "offload": tests/workload/test_recompute.py)."""
    return tuple(
        t
        for t, p in train.placements.items()
        if p == "recompute" and (moe or parts(t, parallel=parallel))
    )


def runs_again(train: TrainSpec, *, moe: bool = False, parallel: bool = False) -> tuple[str, ...]:
    """The named tensors whose op the backward pass of a checkpointed layer runs again:
    `recomputed`'s, and the attention kernel's forward under every policy but "none", its
    output kept or not: the log-sum-exp its backward reads is no named tensor, so no placement
    keeps it (the compiled steps run the forward kernel twice under "dots", "dots_attention",
    "offload" and minimal_flash's placements: cuDNN on H100 and splash on v5p; measured on one
    H100, docs/notes/2026-11-26-h100-matmuls-and-step.md)."""
    again = recomputed(train, moe=moe, parallel=parallel)
    if train.remat == "none" or "attention_out" in again:
        return again
    return (*again, "attention_out")


def kept(
    train: TrainSpec,
    found: dict[str, tuple[tuple[int, ...], int]],
    where: str,
    kernel: str,
    model: ModelSpec,
) -> dict[str, tuple[tuple[int, ...], int]]:
    """The intermediates the recipe keeps `where` ("device" or "offload") for the backward
    pass of a layer of `model`: the named tensors it places there (`parts`), or under "none"
    (no checkpoint) what autodiff itself saves (`residuals`)."""
    if train.remat == "none":
        return residuals(found, kernel, model.mlp) if where == "device" else {}
    return {
        n: found[n]
        for t, p in train.placements.items()
        if p == where
        for n in parts(t, parallel=model.parallel_block)
        if n in found
    }


# The MLP's named intermediates autodiff keeps (residuals), by ModelSpec.mlp.
_MLP_RESIDUALS = {
    "swiglu": ("gate", "up", "gated"),
    "relu": ("activated",),
    "gelu": ("up", "activated"),
}


def residuals(
    found: dict[str, tuple[tuple[int, ...], int]], kernel: str, mlp_kind: str
) -> dict[str, tuple[tuple[int, ...], int]]:
    """What jax's autodiff saves of one layer when nothing is checkpointed: each operation's
    residuals, not the named tensors. Each norm keeps its float32 input and normalised value
    and its output (the projections' input); attention its operands (keys and values gathered
    along the sequence where it is split) and output, splash also its output in the kernel's
    layout and its log-sum-exp; the SwiGLU its gate and up projections, the sigmoid and its
    slope, the SiLU and the product; a ReLU MLP its activation (the down projection's input)
    and the sign of its input (a byte an element); a GELU MLP its input, its tanh and its
    activation. The rotary embedding (linear), the output and down projections and the
    residual adds (their outputs only feed adds) keep nothing. As the TPU
    compiler's buffers show them (LLaMA-3 70B, v5p-1024, fsdp 128 x seq 4: six [layers, rows,
    seq, d_ff] stacks, four float32 [.., d_model], two compute-dtype [.., d_model]). A parallel
    block has one norm (no "mlp norm" in `found`)."""
    f32: tuple[tuple[int, ...], int] = (found["input"][0], 4)
    key = "rotated k" if "rotated k" in found else "k"  # latent attention's k is rotated
    kv = ("gathered k", "gathered v") if "gathered k" in found else (key, "v")
    norms = ("attention", "mlp") if "mlp norm" in found else ("attention",)  # parallel: one
    names = [n for norm in norms for n in (f"{norm} norm input", f"{norm} norm")]
    names += ["rotated q", *kv, "attention"]
    extra: dict[str, tuple[tuple[int, ...], int]] = {f"{norm} normed": f32 for norm in norms}
    extra |= mla.residuals(found)
    if "up" not in found:  # a MoE layer: its block's residuals
        extra |= moe_residuals(found)
    elif mlp_kind == "swiglu":
        mlp = found["up"]
        names += _MLP_RESIDUALS[mlp_kind]
        extra |= {"sigmoid": mlp, "sigmoid slope": mlp, "silu": mlp}
    elif mlp_kind == "relu":
        names += _MLP_RESIDUALS[mlp_kind]
        extra["relu sign"] = (found["up"][0], 1)
    else:
        names += _MLP_RESIDUALS[mlp_kind]
        extra["gelu tanh"] = found["up"]
    if kernel in ("splash", "cudnn"):  # kept as [rows, heads, seq], not as splash writes it
        lse_shape = found["attention logsumexp"][0]
        extra["attention logsumexp"] = (lse_shape[:3], 4)
    if kernel == "splash":
        extra["kernel result"] = found["attention"]
    names += [n for n in ("scores", "probabilities") if n in found]
    return {n: found[n] for n in names} | extra


# What an elementwise fusion makes again from the values around it when a layer's forward and
# backward passes are one computation: the norms' float32 copies (from their input) and the
# activation's by-products (from the MLP's input projections).
_REFUSED = ("attention norm input", "mlp norm input", "attention normed", "mlp normed",
            "sigmoid", "sigmoid slope", "silu", "relu sign", "gelu tanh")  # fmt: skip


def unrolled_residuals(
    found: dict[str, tuple[tuple[int, ...], int]], kernel: str, mlp_kind: str
) -> dict[str, tuple[tuple[int, ...], int]]:
    """What a layer recomputed inside a larger checkpoint holds until its backward pass runs
    (pipeline_remat "iteration": the chunk's layers unrolled in one computation): `residuals`
    less what the compiler fuses into their readers (`_REFUSED`); the matmuls' and the
    kernel's outputs and the compute-dtype values they read stay (LLaMA-3 8B on v5p-128,
    chunks of 8 and 4 layers: 1.07 GB a layer; libtpu's assignments add 1.07 and 0.99 GB a
    layer over the per-layer checkpoint's, docs/notes/2026-11-29-maxtext-pipeline-remat.md)."""
    return {n: v for n, v in residuals(found, kernel, mlp_kind).items() if n not in _REFUSED}
