"""The training loop the step tests share: a few steps of the tiny model on one fixed batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from loadax_mesh import MeshConfig
from loadax_mesh.plan import MeshPlan
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.step import make_step

TINY = ModelSpec.from_name("tiny")


def step_losses(
    plan: MeshPlan, model: ModelSpec, train: TrainSpec, *, batch_axes: Sequence[str], steps: int
) -> np.ndarray:
    """Losses of `steps` steps of `model` on one fixed batch of random tokens
    (`train.global_batch` rows), from the same initial parameters."""
    step = make_step(plan.to_jax_mesh(), model, train, batch_axes=batch_axes)
    params, opt = step.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    shape = (train.global_batch, model.seq_len + 1)
    tokens = rng.integers(0, model.vocab_size, shape).astype(np.int32)
    batch = {
        "tokens": jax.device_put(tokens[:, :-1], step.batch_sharding),
        "targets": jax.device_put(tokens[:, 1:], step.batch_sharding),
    }
    losses = []
    for _ in range(steps):
        params, opt, loss = step.fn(params, opt, batch)
        losses.append(float(loss))
    return np.array(losses)


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
    return step_losses(plan, model, train, batch_axes=batch_axes, steps=steps)


def sharded_and_single_losses(
    model: ModelSpec, train: TrainSpec, *, steps: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """The reference step's losses (`step_losses`) over the `fsdp_tp` preset on every local
    device and on one device."""
    plans = (
        MeshConfig.from_preset("fsdp_tp").plan(),
        MeshConfig((1,), ("data",)).plan(jax.devices()[:1]),
    )
    sharded, single = (
        step_losses(p, model, train, batch_axes=p.batch_axis_names, steps=steps) for p in plans
    )
    return sharded, single
