"""What the strategy examples share: joining the job and a small training loop."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from loadax_mesh import distributed

if distributed.launched():
    distributed.initialize()  # under `loadax-mesh launch`: before jax touches its devices
else:  # one process: 8 CPU devices unless XLA_FLAGS says how many
    if "device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import loadax_mesh as lm


def setup(config: lm.MeshConfig, global_batch: int) -> tuple[Mesh, lm.HostBatchSlice]:
    """Plan `config` on this job's devices, print the plan, and find this host's rows."""
    plan = config.plan()
    if jax.process_index() == 0:
        print(plan.describe().split("\ngrid")[0], flush=True)
    mesh = plan.to_jax_mesh()
    return mesh, lm.host_batch_slice(mesh, global_batch, config.batch_axis_names)


def mlp_params(features: int, hidden: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": rng.standard_normal((features, hidden)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((hidden, features)).astype(np.float32) * 0.1,
    }


def mlp_loss(p: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    pred = jax.numpy.tanh(batch["x"] @ p["w1"]) @ p["w2"]
    return jax.numpy.mean((pred - batch["y"]) ** 2)


def train(
    mesh: Mesh,
    params: dict[str, np.ndarray],
    specs: dict[str, PartitionSpec],
    loss_fn: Callable[[dict[str, jax.Array], dict[str, jax.Array]], jax.Array],
    make_batch: Callable[[int], dict[str, np.ndarray]],
    batch_axes: Any,
    *,
    steps: int = 20,
    lr: float = 0.1,
) -> list[float]:
    """Plain SGD with parameters laid out by `specs`; the batch comes from this host's rows."""
    put = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}

    @jax.jit
    def step(p: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p, batch)
        return jax.tree.map(lambda w, g: w - lr * g, p, grads), loss

    losses = []
    for i in range(steps):
        batch = lm.shard_batch(make_batch(i), mesh, batch_axes)
        put, loss = step(put, batch)
        losses.append(float(loss))
    for name, value in put.items():  # the layout survived the updates
        assert value.sharding.is_equivalent_to(NamedSharding(mesh, specs[name]), value.ndim)
    if jax.process_index() == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {steps} steps", flush=True)
    assert losses[-1] < 0.5 * losses[0], "training did not reduce the loss"
    return losses


def train_mlp(
    config: lm.MeshConfig,
    specs: dict[str, PartitionSpec],
    *,
    global_batch: int = 64,
    features: int = 16,
    hidden: int = 64,
) -> list[float]:
    """Train the two-layer MLP on `config`'s mesh with its weights laid out by `specs`."""
    mesh, rows = setup(config, global_batch)
    return train(
        mesh,
        mlp_params(features, hidden),
        specs,
        mlp_loss,
        lambda i: regression_rows(rows, i, global_batch, features),
        config.batch_axis_names,
        lr=0.5,
    )


def regression_rows(
    rows: lm.HostBatchSlice, step: int, global_batch: int, features: int, seq: int = 0
) -> dict[str, np.ndarray]:
    """This host's rows of a synthetic regression batch (the same global batch on every host)."""
    shape = (global_batch, seq, features) if seq else (global_batch, features)
    x = np.random.default_rng(step).standard_normal(shape).astype(np.float32)
    w = np.random.default_rng(99).standard_normal((features, features)) / np.sqrt(features)
    y = np.tanh(x @ w).astype(np.float32)
    return {"x": x[rows.as_slice()], "y": y[rows.as_slice()]}
