"""What the reference step trains: a model's shape (`ModelSpec`) and how it trains (`TrainSpec`).

Pure Python: the cost model reads these without jax. Models live in configs/models/<name>.toml,
each shape with its source.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from typing import Any

from .._configs import config_path
from ..errors import MeshConfigError

DTYPES = ("float32", "bfloat16")
REMAT = ("full", "dots", "none")
ATTENTION = ("flash", "plain")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES[dtype]


def _positive(value: Any, field: str) -> int:
    if type(value) is not int or value < 1:
        raise MeshConfigError(f"{field}={value!r}; accepted: a positive integer")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer LM: GQA attention, SwiGLU MLP, RMSNorm, layers under a scan."""

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

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for f in fields(self):
            if f.type == "int":
                _positive(getattr(self, f.name), f"{where}: {f.name}")
        if self.d_model % self.num_heads:
            raise MeshConfigError(
                f"{where}: num_heads={self.num_heads} does not divide d_model={self.d_model}; "
                "accepted: a divisor of d_model"
            )
        if self.num_heads % self.num_kv_heads:
            raise MeshConfigError(
                f"{where}: num_kv_heads={self.num_kv_heads} does not divide "
                f"num_heads={self.num_heads}; accepted: a divisor of num_heads"
            )
        if not isinstance(self.tied_embeddings, bool):
            raise MeshConfigError(
                f"{where}: tied_embeddings={self.tied_embeddings!r}; accepted: true or false"
            )

    @property
    def layer_params(self) -> int:
        """Parameters of one layer: two norms, q/k/v/o projections, the SwiGLU MLP."""
        d, hd = self.d_model, self.head_dim
        attention = d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
        return 2 * d + attention + 3 * d * self.d_ff

    @property
    def num_params(self) -> int:
        embeddings = self.vocab_size * self.d_model * (1 if self.tied_embeddings else 2)
        return embeddings + self.num_layers * self.layer_params + self.d_model

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """The model in configs/models/<name>.toml."""
        names = list_models()
        if not isinstance(name, str) or name not in names:
            raise MeshConfigError(
                f"model={name!r} is not a known model; accepted: {', '.join(names)}"
            )
        return cls.from_toml(str(config_path("models", f"{name}.toml")))

    @classmethod
    def from_toml(cls, path: str) -> ModelSpec:
        """A model from a TOML file with this class's fields (`name` and `source` included)."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise MeshConfigError(f"path={path!r} is no readable TOML file: {err}") from None
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        missing = [f.name for f in fields(cls) if f.type == "int" and f.name not in data]
        if unknown or missing or "name" not in data:
            raise MeshConfigError(
                f"model file {path}: unknown keys {unknown}, missing keys "
                f"{missing + ['name'] * ('name' not in data)}; accepted: {names}"
            )
        return cls(**data)


def list_models() -> list[str]:
    """The names of the shipped models (configs/models/*.toml), sorted."""
    return sorted(p.stem for p in config_path("models").glob("*.toml"))


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """How a step trains: the global batch (sequences), dtypes, remat and attention.

    Parameters are kept in `param_dtype` and computed in `compute_dtype`; Adam's two moments are
    kept in `opt_state_dtype`. `remat`: "full" saves only each layer's input for the backward
    pass, "dots" also the matmul outputs, "none" everything. `attention`: "flash" is jax's splash
    kernel on TPU and `jax.nn.dot_product_attention` elsewhere (cuDNN on GPU); "plain" writes the
    score matrix out in XLA.
    """

    global_batch: int
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    opt_state_dtype: str = "float32"
    remat: str = "full"
    attention: str = "flash"
    learning_rate: float = 1e-3

    def __post_init__(self) -> None:
        _positive(self.global_batch, "global_batch")
        for name in ("param_dtype", "compute_dtype", "opt_state_dtype"):
            if getattr(self, name) not in DTYPES:
                raise MeshConfigError(
                    f"{name}={getattr(self, name)!r}; accepted: {', '.join(DTYPES)}"
                )
        if self.remat not in REMAT:
            raise MeshConfigError(f"remat={self.remat!r}; accepted: {', '.join(REMAT)}")
        if self.attention not in ATTENTION:
            raise MeshConfigError(f"attention={self.attention!r}; accepted: {', '.join(ATTENTION)}")
        if type(self.learning_rate) is not float or not self.learning_rate > 0:
            raise MeshConfigError(
                f"learning_rate={self.learning_rate!r}; accepted: a positive float"
            )
