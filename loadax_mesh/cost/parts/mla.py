"""Multi-head latent attention (DeepSeek's MLA) in the cost model: what differs from grouped-query
attention, as the reference step builds it (workload/step.py `_latent_qkv`).

Per token the query goes through a down-projection to `q_lora_rank` (normed) and an
up-projection to every head's `head_dim` = nope + rope (or one full-rank projection); keys and
values through one down-projection to `kv_lora_rank` plus a rope key shared by the heads, the
bottleneck normed and projected up to each head's nope key and value (`v_head_dim`). The ranks
and the rope key are whole on every device of the tensor axis (their weights replicated over
it, sharded over fsdp like d_model); the heads are cut over it. Attention contracts q and k over
`head_dim` and writes `v_head_dim` per head.
"""

from __future__ import annotations

from collections.abc import Callable

from ...workload.spec import ModelSpec

Found = dict[str, tuple[tuple[int, ...], int]]


def attention_weights(model: ModelSpec, m: int) -> int:
    """One layer's attention weights on one device once gathered over fsdp (elements), with a
    tensor axis of size `m`: every projection cut over it (GQA), or (MLA) the heads' up- and
    output projections cut and the down-projections and norms of the bottlenecks whole."""
    if model.attention == "gqa":
        return model.attention_params // m
    d, q, kv = model.d_model, model.q_lora_rank, model.kv_lora_rank
    whole = d * q + q + d * (kv + model.qk_rope_head_dim) + kv
    return whole + (model.attention_params - whole) // m


def op_flops(model: ModelSpec) -> dict[str, float]:
    """FLOPs per token of MLA's ops by the named tensor each produces (2 per weight; causal
    attention: half of 2 * seq * heads * (head_dim + v_head_dim), the scores and the weighted
    values). The query's bottleneck counts with the query, the kv down-projection and the
    keys' share of the up-projection with the key, its values' share with the value."""
    d, h, q, kv = model.d_model, model.num_heads, model.q_lora_rank, model.kv_lora_rank
    hd, nope, rope = model.head_dim, model.qk_nope_head_dim, model.qk_rope_head_dim
    v = model.v_head_dim
    return {
        "query": 2.0 * (d * q + q * h * hd if q else d * h * hd),
        "key": 2.0 * (d * (kv + rope) + kv * h * nope),
        "value": 2.0 * kv * h * v,
        "attention_out": 1.0 * model.seq_len * h * (hd + v),
        "out_proj": 2.0 * h * v * d,
    }


def projections(model: ModelSpec, m: int, matmul: Callable[[int, int], float]) -> dict[str, float]:
    """Seconds of MLA's projections per named tensor, forward, with `matmul(k, n)` a
    [tokens, k] x [k, n] matmul's (cost/timing/step.py): the bottlenecks' whole on each device, the
    heads' cut over the tensor axis of size `m` (the kv up-projection's two parts priced as
    two matmuls, the keys' and the values')."""
    d, heads, q, kv = model.d_model, model.num_heads // m, model.q_lora_rank, model.kv_lora_rank
    hd = model.head_dim
    return {
        "query": matmul(d, q) + matmul(q, heads * hd) if q else matmul(d, heads * hd),
        "key": matmul(d, kv + model.qk_rope_head_dim) + matmul(kv, heads * model.qk_nope_head_dim),
        "value": matmul(kv, heads * model.v_head_dim),
        "out_proj": matmul(heads * model.v_head_dim, d),
    }


def elementwise(model: ModelSpec, m: int) -> tuple[int, int]:
    """Activation elements MLA's memory-bound operations read and write per token beyond what a GQA
    layer's count gives them (cost/timing/step.py `_layer_elementwise`, passed the rope widths as
    q's and k's), forward and backward: each bottleneck's norm (read and written; backward its
    input, output gradient and input gradient), the key assembled from its nope part and the shared
    rope key (read, written whole) and the value sliced out of the up-projection."""
    heads = model.num_heads // m
    ranks = model.q_lora_rank + model.kv_lora_rank
    key = heads * (model.qk_nope_head_dim + model.head_dim) + model.qk_rope_head_dim
    value = 2 * heads * model.v_head_dim
    return 2 * ranks + key + value, 3 * ranks + key + value


def intermediates(model: ModelSpec, found: Found, cd: int) -> Found:
    """A layer's intermediates (memory.py `_intermediates`, built for GQA) as MLA has them:
    `q` the query's up-projection, `k` the key assembled (its rope part rotated: no separate
    rotated key), `v`, the attention's output and every kernel buffer of `v_head_dim`; beside
    them the bottlenecks: the query's down-projection, its float32 norm input and its normed
    output, the kv down-projection (rope key included), its norm's float32 input and output,
    the up-projection to nope keys and values, and the rotated rope key."""
    r, s = found["input"][0][:2]
    heads = found["q"][0][2]
    v, rope, q_rank, kv_rank = (
        model.v_head_dim,
        model.qk_rope_head_dim,
        model.q_lora_rank,
        model.kv_lora_rank,
    )
    out = {n: shape for n, shape in found.items() if n != "rotated k"}
    out["v"] = ((r, s, heads, v), cd)
    out["attention"] = ((r, s, heads, v), cd)
    if "gathered v" in found:
        full = found["gathered v"][0]
        out["gathered v"] = ((*full[:3], v), cd)
    for name in ("kernel output", "kernel dv"):
        if name in found:
            rows, block, _ = found[name][0]
            out[name] = ((rows, block, v), 4)
    if q_rank:
        out |= {
            "q latent": ((r, s, q_rank), cd),
            "q latent norm input": ((r, s, q_rank), 4),
            "q latent normed": ((r, s, q_rank), cd),
        }
    out |= {
        "kv latent": ((r, s, kv_rank + rope), cd),
        "kv latent norm input": ((r, s, kv_rank), 4),
        "kv latent normed": ((r, s, kv_rank), cd),
        "kv up": ((r, s, heads, model.qk_nope_head_dim + v), cd),
        "rope key": ((r, s, 1, rope), cd),
    }
    return out


def residuals(found: Found) -> Found:
    """What autodiff keeps of MLA's bottlenecks with no checkpoint: each norm's float32 input
    and normalised value and its output (the up-projection's input); the rotations and the
    key's assembly are linear and keep nothing."""
    kept: Found = {}
    for prefix in ("q latent", "kv latent"):
        if f"{prefix} normed" in found:
            f32 = found[f"{prefix} norm input"]
            kept |= {
                f"{prefix} norm input": f32,
                f"{prefix} normalised": f32,
                f"{prefix} normed": found[f"{prefix} normed"],
            }
    return kept
