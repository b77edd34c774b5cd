"""The reference training step (docs/design.md section 7): model and train specs (pure Python), the
sharding layout (pure Python) and the step itself (jax, loaded only when used)."""

from .spec import ModelSpec, TrainSpec, list_models

__all__ = ["ModelSpec", "TrainSpec", "list_models"]
