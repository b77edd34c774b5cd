"""A Hugging Face `config.json` read as ModelSpec's fields (`ModelSpec.from_file`). Pure Python.

Each `model_type` is read as transformers' config class for it defines its fields
(configuration_<family>.py; docs/facts/frontier.md section 6.2). A field the file leaves out
takes that class's default only where `DEFAULTS` names it: attention conventions and windows,
and Gemma 3's vocabulary, heads, head_dim and context, which Google's multimodal configs
(gemma-3-12b-pt's `text_config`) leave to Gemma3TextConfig. Any other field the planner reads
must be in the file. `num_key_value_heads` null means multi-head attention and `head_dim` null
hidden_size / num_attention_heads (as every one of these classes reads them).

Read and what it becomes: the MLP of every family is gated (gate, up and down matrices, SiLU
or Gemma's tanh GeLU), ModelSpec's mlp "swiglu" (the activation is numerics, not a shape);
`seq_len` is max_position_embeddings (the context the model was built for; a run sets its own,
`--seq-len`); experts and their layers (below); DeepSeek's latent attention; sliding windows
as `sliding_window` and `global_every` (a `layer_types` list must be "every k-th layer
global"). Ignored, as only inference or numerics read them: RoPE (theta, scaling), norm
epsilons, logit soft-capping, query scaling, router normalisation and group limits, dropout,
the checkpoint's dtype and quantization. Not counted (within 0.3% of any of these models'
parameters): biases (Qwen2's q/k/v, GPT-OSS's), GPT-OSS's attention sinks (64 a layer), Qwen 3's
and Gemma 3's per-head q/k norms, Gemma's extra norms (four a layer), DeepSeek's router bias;
nor DeepSeek's multi-token-prediction layers or a multimodal model's vision tower (the text
model alone is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import MeshConfigError

GATED = "swiglu"  # every family's MLP: three matrices
# A multimodal config's model_type -> its text config's, where the text config leaves it out
TEXT_TYPES = {"gemma3": "gemma3_text"}
_KV = "num_key_value_heads"
# What each family's config class gives a field its file leaves out (see the module docstring)
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {_KV: None, "head_dim": None, "tie_word_embeddings": False},
    "mistral": {_KV: 8, "head_dim": None, "tie_word_embeddings": False, "sliding_window": 4096},
    "mixtral": {_KV: 8, "head_dim": None, "tie_word_embeddings": False, "sliding_window": None},
    "qwen2": {_KV: 32, "head_dim": None, "tie_word_embeddings": False},
    "qwen3": {_KV: 32, "head_dim": 128, "tie_word_embeddings": False},
    "qwen3_moe": {
        _KV: 4,
        "head_dim": None,
        "tie_word_embeddings": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": None,
    },
    "deepseek_v3": {
        _KV: None,
        "tie_word_embeddings": False,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
    },
    "gemma2": {_KV: 4, "head_dim": 256, "tie_word_embeddings": True, "sliding_window": 4096},
    "gemma3_text": {
        _KV: 4,
        "head_dim": 256,
        "tie_word_embeddings": True,
        "sliding_window": 4096,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "num_attention_heads": 8,
    },
    "gpt_oss": {_KV: 8, "head_dim": 64, "tie_word_embeddings": False, "sliding_window": 128},
}
for _qwen in ("qwen2", "qwen3", "qwen3_moe"):  # a window only with use_sliding_window
    DEFAULTS[_qwen] |= {
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    }
MODEL_TYPES = tuple(DEFAULTS) + tuple(TEXT_TYPES)
# The expert count's names: transformers' attribute_map aliases of one another
EXPERT_COUNT = ("num_local_experts", "num_experts", "n_routed_experts")
SLIDING, FULL = "sliding_attention", "full_attention"


class Fields:
    """One config's fields, read with the family's defaults; errors name the file."""

    def __init__(self, path: str, family: str, data: dict[str, Any]) -> None:
        self.path, self.family, self.data = path, family, data

    def error(self, text: str) -> MeshConfigError:
        return MeshConfigError(f"model file {self.path} (model_type {self.family!r}): {text}")

    def get(self, name: str, accepted: str = "a positive integer") -> Any:
        if name in self.data:
            return self.data[name]
        if name in DEFAULTS[self.family]:
            return DEFAULTS[self.family][name]
        raise self.error(f"{name} is missing; accepted: {accepted}")

    def size(self, name: str, *, minimum: int = 1) -> int:
        value = self.get(name, "a positive integer" if minimum else "a non-negative integer")
        if type(value) is not int or value < minimum:
            kind = "a positive integer" if minimum else "a non-negative integer"
            raise self.error(f"{name}={value!r}; accepted: {kind}")
        return value

    def flag(self, name: str) -> bool:
        value = self.get(name, "true or false")
        if not isinstance(value, bool):
            raise self.error(f"{name}={value!r}; accepted: true or false")
        return value

    def experts(self) -> int:
        """The expert count under whichever of its names the file uses (0: none)."""
        given = {n: self.data[n] for n in EXPERT_COUNT if n in self.data}
        if len(set(map(repr, given.values()))) > 1:
            raise self.error(f"expert counts {given} disagree; accepted: one count")
        if not given:
            raise self.error(f"the expert count is missing; accepted: {' or '.join(EXPERT_COUNT)}")
        name, value = next(iter(given.items()))
        if value is None:
            return 0
        if type(value) is not int or value < 0:
            raise self.error(f"{name}={value!r}; accepted: a non-negative integer")
        return value


def read_hf_config(path: str) -> dict[str, Any]:
    """ModelSpec's keyword arguments for the Hugging Face config.json at `path`.

    Raises:
        MeshConfigError: an unreadable file, an unknown `model_type`, or a field missing or
            invalid (the message names the file, the field and what is accepted).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MeshConfigError(f"path={path!r} is no readable JSON file: {err}") from None
    if not isinstance(data, dict):
        raise MeshConfigError(f"model file {path}: not a JSON object; accepted: a config.json")
    text, family = data, data.get("model_type")
    if "text_config" in data:  # a multimodal model: its text model alone
        text = data["text_config"]
        if not isinstance(text, dict):
            raise MeshConfigError(f"model file {path}: text_config={text!r}; accepted: an object")
        family = text.get("model_type", TEXT_TYPES.get(str(family)))
    if family not in DEFAULTS:
        where = "text_config.model_type" if text is not data else "model_type"
        raise MeshConfigError(
            f"model file {path}: {where}={family!r} is not a family read here; accepted: "
            f"{', '.join(MODEL_TYPES)}"
        )
    f = Fields(path, family, text)
    return {"name": model_name(Path(path), data), "source": path, **_fields(f)}


def model_name(path: Path, data: dict[str, Any]) -> str:
    """`_name_or_path`'s last part; else the file's stem, or for a file named config.json the
    model's directory (in the Hub's cache, models--org--name/snapshots/HASH/, its name)."""
    named = data.get("_name_or_path")
    if isinstance(named, str) and named.strip("/"):
        return named.rstrip("/").rsplit("/", 1)[-1]
    if path.stem != "config":
        return path.stem
    folder = path.resolve().parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.rsplit("--", 1)[-1]
    return folder.name or path.stem


def _fields(f: Fields) -> dict[str, Any]:
    if f.data.get("use_bidirectional_attention"):  # Gemma's encoders (EmbeddingGemma)
        raise f.error(
            f"use_bidirectional_attention={f.data['use_bidirectional_attention']!r} (an "
            "encoder); accepted: a causal decoder (false or absent)"
        )
    heads = f.size("num_attention_heads")
    out: dict[str, Any] = {
        "num_layers": f.size("num_hidden_layers"),
        "d_model": f.size("hidden_size"),
        "d_ff": f.size("intermediate_size"),
        "num_heads": heads,
        "num_kv_heads": heads if f.get(_KV) is None else f.size(_KV),
        "vocab_size": f.size("vocab_size"),
        "seq_len": f.size("max_position_embeddings"),
        "tied_embeddings": f.flag("tie_word_embeddings"),
        "mlp": GATED,
    }
    if f.family == "deepseek_v3":
        out |= _latent(f, heads)
    elif f.get("head_dim", "a positive integer, or null") is None:
        if out["d_model"] % heads:
            raise f.error(
                f"head_dim=None with hidden_size={out['d_model']} not a multiple of "
                f"num_attention_heads={heads}; accepted: a positive integer"
            )
        out["head_dim"] = out["d_model"] // heads
    else:
        out["head_dim"] = f.size("head_dim")
    out |= _experts(f, out["num_layers"], out["d_ff"])
    return out | _window(f, out["num_layers"])


def _latent(f: Fields, heads: int) -> dict[str, Any]:
    """DeepSeek's multi-head latent attention. Its config's own `head_dim` is qk_rope_head_dim
    (transformers sets it so), not a query/key head's width, nope + rope: not read. Keys and
    values are expanded per head, so num_key_value_heads is num_attention_heads."""
    q_rank = f.get("q_lora_rank", "a positive integer, or null (a full-rank query)")
    nope, rope = f.size("qk_nope_head_dim"), f.size("qk_rope_head_dim")
    return {
        "attention": "mla",
        "num_kv_heads": heads,
        "head_dim": nope + rope,
        "q_lora_rank": 0 if q_rank is None else f.size("q_lora_rank"),
        "kv_lora_rank": f.size("kv_lora_rank"),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": f.size("v_head_dim"),
    }


def _experts(f: Fields, layers: int, d_ff: int) -> dict[str, Any]:
    """Mixtral's and GPT-OSS's experts in every layer, of intermediate_size; Qwen3-MoE's and
    DeepSeek's of moe_intermediate_size, in the layers their rules name (dense ones d_ff)."""
    if f.family not in ("mixtral", "gpt_oss", "qwen3_moe", "deepseek_v3"):
        return {}
    experts = f.experts()
    per_token = None if experts == 0 else f.get("num_experts_per_tok")
    if not experts or per_token is None:
        return {}  # DeepSeek's "None means dense model"
    out: dict[str, Any] = {
        "num_experts": experts,
        "experts_per_token": f.size("num_experts_per_tok"),
        "moe_d_ff": d_ff,
    }
    if f.family == "qwen3_moe":
        step = f.size("decoder_sparse_step")
        dense = f.get("mlp_only_layers") or []
        if not isinstance(dense, list) or any(type(i) is not int for i in dense):
            raise f.error(f"mlp_only_layers={dense!r}; accepted: a list of layer indices")
        moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
        named = f"decoder_sparse_step={step}, mlp_only_layers={dense}"
        out["moe_d_ff"] = f.size("moe_intermediate_size")
    elif f.family == "deepseek_v3":
        first, every = f.size("first_k_dense_replace", minimum=0), f.size("moe_layer_freq")
        moe = [i for i in range(first, layers) if i % every == 0]
        named = f"first_k_dense_replace={first}, moe_layer_freq={every}"
        out |= {
            "moe_d_ff": f.size("moe_intermediate_size"),
            "num_shared_experts": f.size("n_shared_experts", minimum=0),
            "routed_scaling": _scaling(f),
            "router": _router(f),
        }
    else:
        return out
    return out | _layout(f, moe, layers, named) if moe else {}  # no MoE layer: a dense model


def _layout(f: Fields, moe: list[int], layers: int, named: str) -> dict[str, Any]:
    """first_dense_layers and moe_every giving exactly the MoE layers `moe` (ModelSpec's
    layers first + moe_every - 1, first + 2 moe_every - 1, ...); refused where none does."""
    for first in range(layers):
        for every in range(1, layers - first + 1):
            if list(range(first + every - 1, layers, every)) == moe:
                return {"first_dense_layers": first, "moe_every": every}
    raise f.error(
        f"{named} make layers {moe} of {layers} MoE layers, which ModelSpec does not express; "
        "accepted: first_dense_layers dense layers, then every moe_every-th a MoE layer"
    )


def _scaling(f: Fields) -> float:
    value = f.get("routed_scaling_factor")
    if type(value) not in (int, float) or not 0 < value < float("inf"):
        raise f.error(f"routed_scaling_factor={value!r}; accepted: a positive finite number")
    return float(value)


def _router(f: Fields) -> str:
    """DeepSeek-V3 scores experts by sigmoid (transformers' model always does; a config's
    scoring_func may say softmax, DeepSeek's earlier router)."""
    scoring = f.get("scoring_func")
    if scoring not in ("sigmoid", "softmax"):
        raise f.error(f"scoring_func={scoring!r}; accepted: sigmoid, softmax")
    return str(scoring)


def _window(f: Fields, layers: int) -> dict[str, Any]:
    """`sliding_window` and `global_every` from the family's rule for which layers slide."""
    if f.family in ("llama", "deepseek_v3"):
        return {}
    if f.family.startswith("qwen") and not f.flag("use_sliding_window"):
        return {}  # transformers nulls the window unless use_sliding_window
    width = f.get("sliding_window", "a positive integer, or null (no window)")
    if width is None:
        return {}
    width = f.size("sliding_window")
    if "layer_types" in f.data:
        return _pattern(f, f.data["layer_types"], layers, width)
    if f.family in ("mistral", "mixtral"):
        return {"sliding_window": width}  # every layer
    if f.family.startswith("qwen"):  # layers max_window_layers and on slide
        start = f.size("max_window_layers", minimum=0)
        return _pattern(
            f, [FULL] * min(start, layers) + [SLIDING] * (layers - start), layers, width
        )
    if f.family == "gemma3_text":  # every sliding_window_pattern-th layer global
        names = [n for n in ("sliding_window_pattern", "_sliding_window_pattern") if n in f.data]
        every = f.size(names[0]) if names else 6
        return _pattern(
            f, [FULL if (i + 1) % every == 0 else SLIDING for i in range(layers)], layers, width
        )
    return _pattern(f, [FULL if i % 2 else SLIDING for i in range(layers)], layers, width)


def _pattern(f: Fields, kinds: Any, layers: int, width: int) -> dict[str, Any]:
    """A list of per-layer attention kinds as ModelSpec's window: every layer sliding (every 0),
    every k-th (from 1) global, or none sliding (no window); refused otherwise."""
    if not isinstance(kinds, list) or len(kinds) != layers or set(kinds) - {SLIDING, FULL}:
        raise f.error(
            f"layer_types={kinds!r}; accepted: a list of num_hidden_layers={layers} entries, each "
            f"{SLIDING!r} or {FULL!r}"
        )
    full = [i for i, kind in enumerate(kinds) if kind == FULL]
    if len(full) == layers:
        return {}
    if not full:
        return {"sliding_window": width}
    every = full[0] + 1
    if full != list(range(every - 1, layers, every)):
        raise f.error(
            f"layer_types make layers {full} global, not every k-th layer; accepted: every layer "
            "sliding, or every global_every-th layer (counting from 1) global"
        )
    return {"sliding_window": width, "global_every": every}
