"""The training loop the step tests share: a few steps of the tiny model on one fixed batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from loadax_mesh.plan import MeshPlan
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

TINY = ModelSpec.from_name("tiny")


def train_losses(
    plan: MeshPlan,
    *,
    batch_axes: Sequence[str],
    steps: int = 4,
    model: ModelSpec = TINY,
    **spec: Any,
) -> np.ndarray:
    """Losses of `steps` steps of `model` on one fixed batch of 8 rows, from the same initial
    parameters; `spec` holds the TrainSpec fields beside the batch and learning rate."""
    train = TrainSpec(global_batch=8, learning_rate=1e-2, **spec)
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=batch_axes)
    params, opt = step.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (8, model.seq_len + 1)).astype(np.int32)
    batch = {
        "tokens": jax.device_put(tokens[:, :-1], step.batch_sharding),
        "targets": jax.device_put(tokens[:, 1:], step.batch_sharding),
    }
    losses = []
    for _ in range(steps):
        params, opt, loss = step.fn(params, opt, batch)
        losses.append(float(loss))
    return np.array(losses)
