"""A model's shape (`ModelSpec`): the dense fields every model has, and the keyword fields of
mixtures of experts, latent attention and two-matrix MLPs; its parameter counts. Pure Python:
the cost model reads it without jax. Models live in configs/models/<name>.toml, each shape with
its source.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import KW_ONLY, MISSING, dataclass, fields
from typing import Any

from .._configs import config_path
from ..errors import MeshConfigError

# A model's shape beyond the dense fields (ModelSpec).
MLPS = ("swiglu", "relu", "gelu")
ROUTERS = ("softmax", "sigmoid")
ATTENTIONS = ("gqa", "mla")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# The expert fields' values in a dense model (num_experts=0).
_DENSE_DEFAULTS: dict[str, Any] = {
    "experts_per_token": 0,
    "moe_d_ff": 0,
    "num_shared_experts": 0,
    "first_dense_layers": 0,
    "moe_every": 1,
    "router": "softmax",
    "routed_scaling": 1.0,
}


def _positive(value: Any, field: str) -> int:
    if type(value) is not int or value < 1:
        raise MeshConfigError(f"{field}={value!r}; accepted: a positive integer")
    return value


def _count(value: Any, field: str) -> int:
    if type(value) is not int or value < 0:
        raise MeshConfigError(f"{field}={value!r}; accepted: a non-negative integer")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer LM: RMSNorm, layers under a scan; by default GQA attention
    and a SwiGLU MLP in every layer (a dense model), which is what the reference step and the
    cost model build (`layout.check_modelled`).

    The keyword fields describe other published shapes. `mlp`: "swiglu" (three matrices) or a
    two-matrix MLP, "relu" or "gelu". `num_experts` > 0 makes layers mixtures of experts:
    each token goes to `experts_per_token` of them (chosen by a "softmax" or "sigmoid"
    `router`), each expert an MLP of width `moe_d_ff`, plus `num_shared_experts` of that width
    every token uses; the routed experts' weighted sum is scaled by `routed_scaling`
    (DeepSeek-V3: 2.5). The first `first_dense_layers` layers are dense (width `d_ff`); of the
    rest every `moe_every`-th is a MoE layer (counting from 0: first + moe_every - 1,
    first + 2 * moe_every - 1, ...), the others dense. `attention` "mla" is multi-head latent
    attention: queries through a rank `q_lora_rank` bottleneck (0: a full-rank projection),
    keys and values through one of rank `kv_lora_rank` (each bottleneck normed);
    `qk_nope_head_dim` + `qk_rope_head_dim` = `head_dim` per query/key head, `v_head_dim` per
    value head. `num_heads * head_dim` need not equal `d_model`. `sliding_window` > 0 makes
    layers local, each token attending to itself and the `sliding_window` - 1 tokens before it;
    with `global_every` > 0 every `global_every`-th layer (counting from 1) stays global (Gemma
    3: 1024 and 6; 0: every layer local). `parallel_block`: attention and
    the MLP both read one RMSNorm of the layer's input and their outputs are added to the
    residual together (GPT-J's and PaLM's layer, MaxText's of 2023); otherwise each sublayer
    has its own norm and adds to the residual in turn.

    Raises:
        MeshConfigError: when built with a size that is not a positive int, an unknown `mlp`,
            `router` or `attention`, experts per token above the expert count, latent
            attention without its ranks, or a `tied_embeddings` or `parallel_block` that is not
            a bool.
    """

    name: str
    num_layers: int
    d_model: int
    d_ff: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    seq_len: int
    tied_embeddings: bool = False
    source: str = ""
    _: KW_ONLY
    mlp: str = "swiglu"
    num_experts: int = 0
    experts_per_token: int = 0
    moe_d_ff: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    moe_every: int = 1
    router: str = "softmax"
    routed_scaling: float = 1.0
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    parallel_block: bool = False
    sliding_window: int = 0
    global_every: int = 0

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for f in fields(self):
            if f.type == "int" and f.default is MISSING:
                _positive(getattr(self, f.name), f"{where}: {f.name}")
            elif f.type == "int":
                _count(getattr(self, f.name), f"{where}: {f.name}")
        if self.num_heads % self.num_kv_heads:
            raise MeshConfigError(
                f"{where}: num_kv_heads={self.num_kv_heads} does not divide "
                f"num_heads={self.num_heads}; accepted: a divisor of num_heads"
            )
        for flag in ("tied_embeddings", "parallel_block"):
            if not isinstance(getattr(self, flag), bool):
                raise MeshConfigError(
                    f"{where}: {flag}={getattr(self, flag)!r}; accepted: true or false"
                )
        scaling = self.routed_scaling
        if type(scaling) not in (int, float) or not 0 < scaling < math.inf:
            raise MeshConfigError(
                f"{where}: routed_scaling={scaling!r}; accepted: a positive finite number"
            )
        for field, accepted in (("mlp", MLPS), ("router", ROUTERS), ("attention", ATTENTIONS)):
            if getattr(self, field) not in accepted:
                raise MeshConfigError(
                    f"{where}: {field}={getattr(self, field)!r}; accepted: {', '.join(accepted)}"
                )
        self._check_experts(where)
        self._check_mla(where)
        self._check_window(where)

    def _check_window(self, where: str) -> None:
        if not self.sliding_window and self.global_every:
            raise MeshConfigError(
                f"{where}: global_every={self.global_every} with sliding_window=0 (every layer "
                "global); accepted: 0, or a sliding_window > 0"
            )

    def _check_experts(self, where: str) -> None:
        if not self.num_experts:
            for field, dense in _DENSE_DEFAULTS.items():
                if getattr(self, field) != dense:
                    raise MeshConfigError(
                        f"{where}: {field}={getattr(self, field)!r} with num_experts=0 (a dense "
                        f"model); accepted: {dense!r}, or num_experts > 0"
                    )
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise MeshConfigError(
                f"{where}: experts_per_token={self.experts_per_token} with num_experts="
                f"{self.num_experts}; accepted: 1 to {self.num_experts}"
            )
        for field in ("moe_d_ff", "moe_every"):
            if getattr(self, field) < 1:
                raise MeshConfigError(
                    f"{where}: {field}=0 with num_experts={self.num_experts}; accepted: a "
                    "positive integer"
                )
        if self.first_dense_layers + self.moe_every > self.num_layers:
            raise MeshConfigError(
                f"{where}: first_dense_layers={self.first_dense_layers} and moe_every="
                f"{self.moe_every} leave no MoE layer of num_layers={self.num_layers}; accepted: "
                "first_dense_layers + moe_every <= num_layers"
            )

    def _check_mla(self, where: str) -> None:
        if self.attention == "gqa":
            for field in MLA_FIELDS:
                if getattr(self, field):
                    raise MeshConfigError(
                        f"{where}: {field}={getattr(self, field)} with attention='gqa'; "
                        "accepted: 0, or attention='mla'"
                    )
            return
        for field in MLA_FIELDS[1:]:  # q_lora_rank may be 0: a full-rank query projection
            if getattr(self, field) < 1:
                raise MeshConfigError(
                    f"{where}: {field}=0 with attention='mla'; accepted: a positive integer"
                )
        if self.qk_rope_head_dim % 2:
            raise MeshConfigError(
                f"{where}: qk_rope_head_dim={self.qk_rope_head_dim} with attention='mla'; "
                "accepted: an even number (rotary positions rotate its two halves)"
            )
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.head_dim != qk:
            raise MeshConfigError(
                f"{where}: head_dim={self.head_dim} with attention='mla'; accepted: "
                f"qk_nope_head_dim + qk_rope_head_dim = {qk} (a query/key head's width)"
            )
        if self.num_kv_heads != self.num_heads:
            raise MeshConfigError(
                f"{where}: num_kv_heads={self.num_kv_heads} with attention='mla'; accepted: "
                f"num_heads={self.num_heads} (latent attention expands keys and values per head)"
            )

    def window(self, layer: int) -> int:
        """The window layer `layer` (from 0) attends over: `sliding_window` tokens on a local
        layer, 0 (its whole causal prefix) on a global one."""
        if not self.sliding_window:
            return 0
        every = self.global_every
        return 0 if every and (layer + 1) % every == 0 else self.sliding_window

    @property
    def num_local_layers(self) -> int:
        """Layers that attend over the last `sliding_window` tokens only (0 without a window)."""
        return sum(1 for i in range(self.num_layers) if self.window(i))

    @property
    def attention_params(self) -> int:
        """One layer's attention weights: q/k/v/o projections; MLA's down- and
        up-projections and the norms of its bottlenecks."""
        d, h = self.d_model, self.num_heads
        if self.attention == "gqa":
            return d * self.head_dim * (2 * h + 2 * self.num_kv_heads)
        q_rank, kv_rank, rope = self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim
        query = q_rank * (d + 1 + h * self.head_dim) if q_rank else d * h * self.head_dim
        kv = (
            d * (kv_rank + rope) + kv_rank + kv_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
        )
        return query + kv + h * self.v_head_dim * d

    def mlp_params(self, width: int) -> int:
        """One MLP of `width` (a dense layer's, or one expert): three matrices for SwiGLU,
        two otherwise."""
        return (3 if self.mlp == "swiglu" else 2) * self.d_model * width

    @property
    def num_moe_layers(self) -> int:
        """Layers that are mixtures of experts (0 for a dense model)."""
        if not self.num_experts:
            return 0
        return (self.num_layers - self.first_dense_layers) // self.moe_every

    def _layer_params(self, experts: int) -> int:
        """A layer's parameters with `experts` routed experts (0: a dense layer)."""
        if not experts:
            mlp = self.mlp_params(self.d_ff)
        else:
            shared = self.num_shared_experts * self.mlp_params(self.moe_d_ff)
            mlp = (
                self.d_model * self.num_experts + experts * self.mlp_params(self.moe_d_ff) + shared
            )
        return self.norms * self.d_model + self.attention_params + mlp

    @property
    def norms(self) -> int:
        """RMSNorms a layer applies to the residual stream: one for a parallel block, two
        otherwise (before attention, before the MLP)."""
        return 1 if self.parallel_block else 2

    @property
    def layer_params(self) -> int:
        """Parameters of one layer of a dense model (every layer alike): its norms (`norms`),
        attention, the MLP. A model with MoE layers has no single figure: see num_params."""
        if self.num_experts:
            raise MeshConfigError(
                f"model {self.name!r}: layer_params of a model with num_experts="
                f"{self.num_experts}; its layers differ; accepted: a dense model (num_experts=0)"
            )
        return self._layer_params(0)

    def _params(self, experts: int) -> int:
        embeddings = self.vocab_size * self.d_model * (1 if self.tied_embeddings else 2)
        moe = self.num_moe_layers
        dense = (self.num_layers - moe) * self._layer_params(0)
        return embeddings + dense + moe * self._layer_params(experts) + self.d_model

    @property
    def num_params(self) -> int:
        """Every weight: the embedding (and the unembedding unless tied), every layer's norms,
        attention and MLP (all experts, shared ones and the router), the final norm."""
        return self._params(self.num_experts)

    @property
    def num_active_params(self) -> int:
        """The weights one token uses: num_params less the routed experts it is not sent to.
        The whole embedding table counts (the lookup reads one row of it), as Mistral, Qwen and
        Meta count their models' active parameters; DeepSeek's 37B for V3 leaves it out."""
        return self._params(self.experts_per_token)

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """The model in `configs/models/<name>.toml`.

        Args:
            name: a catalogue model such as "llama3-8b" (`loadax-mesh models` lists them).

        Returns:
            The `ModelSpec`.

        Raises:
            MeshConfigError: an unknown name.
        """
        names = list_models()
        if not isinstance(name, str) or name not in names:
            raise MeshConfigError(
                f"model={name!r} is not a known model; accepted: {', '.join(names)}"
            )
        return cls.from_toml(str(config_path("models", f"{name}.toml")))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ModelSpec:
        """A model from a file: a TOML in the catalogue's schema (`from_toml`), or a Hugging Face
        `config.json` of a family in `hf_config.MODEL_TYPES` (llama, mistral, mixtral, qwen2,
        qwen3, qwen3_moe, deepseek_v3, gemma2, gemma3 / gemma3_text, gpt_oss; a multimodal
        config through its `text_config`, the text model alone), its fields mapped as the
        family defines them (workload/hf_config.py says how, and what is not read).

        A config.json's `seq_len` is its max_position_embeddings, the context the model was
        built for, not a training run's length: set that with `dataclasses.replace(model,
        seq_len=N)` (`--seq-len N` on the command line). Its `name` is `_name_or_path`'s last
        part, else the file's stem (its directory's name for a config.json); `source` the path.

        Args:
            path: a `.toml` file, or a JSON file (any other name).

        Returns:
            The `ModelSpec`.

        Raises:
            MeshConfigError: an unreadable file, an unknown model_type, or a field missing or
                invalid; the message names the file, the field and what is accepted.
        """
        text = os.fspath(path)
        if text.endswith(".toml"):
            return cls.from_toml(text)
        from .hf_config import read_hf_config

        spec = read_hf_config(text)
        try:
            return cls(**spec)
        except MeshConfigError as err:
            raise MeshConfigError(f"model file {text}: {err}") from None

    @classmethod
    def from_toml(cls, path: str) -> ModelSpec:
        """A model from a TOML file with this class's fields (`name` and `source` included).

        Args:
            path: the TOML file.

        Returns:
            The `ModelSpec`.

        Raises:
            MeshConfigError: the file is unreadable, or a field is missing, unknown or invalid.
        """
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise MeshConfigError(f"path={path!r} is no readable TOML file: {err}") from None
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
        if unknown or missing:
            raise MeshConfigError(
                f"model file {path}: unknown keys {unknown}, missing keys {missing}; accepted: "
                f"{names}"
            )
        return cls(**data)


def list_models() -> list[str]:
    """The names of the shipped models (configs/models/*.toml), sorted."""
    return sorted(p.stem for p in config_path("models").glob("*.toml"))
