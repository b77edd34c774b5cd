"""Models as text and data (`loadax-mesh models`): the catalogue as a table, or one model (a
catalogue name or a model file) with its parameter counts, total and active."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .report import text_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..workload.model import ModelSpec


def params_text(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def model_data(m: ModelSpec) -> dict[str, Any]:
    """Every field, and both parameter counts."""
    return {**vars(m), "num_params": m.num_params, "num_active_params": m.num_active_params}


def models_text(models: Sequence[ModelSpec]) -> str:
    """The catalogue: one row a model, its parameters (total and active a token) and shape."""
    header = "model params active layers d_model d_ff heads kv head vocab seq"
    rows: list[list[Any]] = [header.split()]
    for m in models:
        counts = [params_text(m.num_params), params_text(m.num_active_params)]
        shape = [m.num_layers, m.d_model, m.d_ff, m.num_heads, m.num_kv_heads, m.head_dim]
        rows.append([m.name, *counts, *shape, m.vocab_size, m.seq_len])
    return (
        text_table(rows) + "\n\nSources: configs/models/<name>.toml (or --format json); one "
        "model, or a model file, in full: --model NAME|FILE"
    )


def model_text(m: ModelSpec, given: str) -> str:
    """One model as `--model` read it (`given`: the name or path): where from, its parameter
    counts, shape, attention and window, experts."""
    where = m.source if given != m.name else f"configs/models/{m.name}.toml: {m.source}"
    heads = f"{m.num_heads} heads of {m.head_dim} over {m.num_kv_heads} kv heads"
    tied = " (tied)" if m.tied_embeddings else ""
    lines = [
        f"model      {m.name}, read from {given}" if given != m.name else f"model      {m.name}",
        f"params     {params_text(m.num_params)} ({m.num_params:,}), active a token "
        f"{params_text(m.num_active_params)} ({m.num_active_params:,})",
        f"shape      {m.num_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, {heads}, vocab "
        f"{m.vocab_size}{tied}, mlp {m.mlp}" + ", parallel block" * m.parallel_block,
        f"sequence   {m.seq_len} tokens (the model's seq_len; a run sets its own with --seq-len)",
        f"attention  {m.attention}" + _window(m) + _latent(m),
    ]
    if m.num_experts:
        shared = f" + {m.num_shared_experts} shared" if m.num_shared_experts else ""
        lines.append(
            f"experts    {m.num_experts}{shared} of width {m.moe_d_ff}, {m.experts_per_token} a "
            f"token ({m.router} router); {m.num_moe_layers} of {m.num_layers} layers MoE"
        )
    return "\n".join([*lines, f"source     {where}"])


def _window(m: ModelSpec) -> str:
    if not m.sliding_window:
        return "; every layer attends to its whole causal prefix"
    every = f" (every {_ordinal(m.global_every)} layer global)" if m.global_every else ""
    return (
        f"; a window of {m.sliding_window} tokens on {m.num_local_layers} of {m.num_layers} "
        f"layers{every}"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _latent(m: ModelSpec) -> str:
    if m.attention != "mla":
        return ""
    return (
        f"; q rank {m.q_lora_rank or 'full'}, kv rank {m.kv_lora_rank}, q/k heads "
        f"{m.qk_nope_head_dim} + {m.qk_rope_head_dim} (rope), v heads {m.v_head_dim}"
    )
